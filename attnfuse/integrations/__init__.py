"""Integrations with other libraries; each is imported on its own and changes nothing until asked."""
