// Process-wide settings of every k3serve process, and of the benchmarks that stand in for one
// (bench/transport_bench, the single-process engine of bench/cluster_bench), so that they measure
// what a node runs.
#ifndef K3SERVE_CLUSTER_PROCESS_TUNING_H_
#define K3SERVE_CLUSTER_PROCESS_TUNING_H_

namespace k3 {

// Call first in main, before any other thread exists.
//  - glibc keeps buffers of up to 32 MiB on its heap and does not trim it: data-plane buffers of
//    128 KiB and more would otherwise be fresh mappings on every step, and their page faults
//    dominate an all-to-all round (measured in bench/transport_bench).
//  - In optimized builds (NDEBUG: -c opt, the image, the benchmarks), Abseil's mutex deadlock
//    detection is off, as in Abseil's own release builds: Debian builds Abseil without NDEBUG, so
//    every Mutex would keep a lock graph, 3.3x the cost of a lock (36 vs 119 ns for two nested
//    lock/unlock pairs on this project's VM), paid on every data-plane message. Other builds,
//    the tests' included, keep it.
void TuneServingProcess();

}  // namespace k3

#endif  // K3SERVE_CLUSTER_PROCESS_TUNING_H_
