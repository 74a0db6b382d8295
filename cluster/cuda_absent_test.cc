// Stands in for the GPU tests where Bazel found no CUDA toolkit (third_party/cuda leaves them out).
#include <cstdio>

int main() {
  std::puts("skipped: no GPU (built without the CUDA toolkit)");
  return 0;
}
