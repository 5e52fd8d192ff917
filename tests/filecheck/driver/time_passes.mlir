// --time-passes prints an execution time report to stderr.
// RUN: attnfuse-opt %s -p cse,canonicalize --time-passes 2>&1 >/dev/null | filecheck %s

func.func @f(%a: i32) -> i32 {
  func.return %a : i32
}

// CHECK:      ... Execution time report ...
// CHECK:      Total Execution Time: {{[0-9.]+}} seconds
// CHECK:      ----Wall Time----  ----Name----
// CHECK-NEXT: {{[0-9.]+}} ({{ *[0-9.]+}}%)  (parse)
// CHECK-NEXT: {{[0-9.]+}} ({{ *[0-9.]+}}%)  cse
// CHECK-NEXT: {{[0-9.]+}} ({{ *[0-9.]+}}%)  canonicalize
// CHECK-NEXT: {{[0-9.]+}} ({{ *[0-9.]+}}%)  (verifier)
// CHECK-NEXT: {{[0-9.]+}} ({{ *[0-9.]+}}%)  (output)
// CHECK-NEXT: {{[0-9.]+}} (100.0%)  Total
