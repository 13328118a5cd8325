// The interface between the driver (growmem_native.cc: FFI handlers, threads, merging) and the
// vectorised bodies (isa_*.cc, one per instruction set, all instantiating reduce_impl.h).
//
// Notation (growmem/kernels.py): queries q (B, d_in), rows k (N, d_in), v (N, d_out), w (N,), c (N,);
// scores s = α⟨k, q⟩ ("dot") or s = −α‖q − k‖² ("neg_sqdist"); e = c κ(s − m); the partial
// (m, num, den) with num = Σ e v, den = Σ e w (module docstring of growmem.kernels).
//
// Layout inside the native kernel: the B queries are cut into G groups of W lanes (W = the vector
// width in floats: 16 for AVX-512, 8 for AVX2 and the generic build); lane l of group g is query
// g·W + l, lanes past B are zero. A row's scores for one group are one vector, so a row is read once
// per pass and meets all W queries of a group in one multiply-add per element.
#pragma once

#include <cstddef>
#include <cstdint>

namespace growmem {

//: rows per block: a block's rows (k and v, widened to float32 when stored as bfloat16) stay in L2
//: while every query group passes over them
constexpr int64_t kBlockRows = 64;

enum Form : int32_t { kDot = 0, kNegSqdist = 1 };

struct KernelSpec {
  int32_t form;      // kDot | kNegSqdist
  bool exponential;  // κ(s) = e^{s − m}, else κ(s) = s
  bool normalised;   // den = Σ c w κ (and the stabiliser m = max(s + log|c w|))
};

// The rows as XLA hands them over: row-major, unpadded.
struct Rows {
  const void* k;
  bool k_bf16;
  int64_t d_in;
  const void* v;
  bool v_bf16;
  int64_t d_out;
  const float* w;  // (N,), nullptr when the kernel has no denominator
  const float* c;  // (N,), nullptr: c_i = 1
};

// The queries laid out per group by the driver.
struct Queries {
  int64_t b;        // B
  int64_t groups;   // G = ceil(B / W)
  const float* qt;  // (G, d_in, W): q transposed, zero lanes past B
  const float* q2;  // (G, W): ‖q‖²
  const float* qp;  // (G, W, d_in_pad): q by lane, rows padded with zeros (row gradients), or nullptr
  int64_t d_in_pad;
};

// One part's partial of the forward pass (merged by the driver, log-sum-exp rule).
struct FwdAcc {
  float* m;    // (G, W)
  float* den;  // (G, W)
  float* zt;   // (G, d_out, W): num transposed
};

struct FwdCall {
  KernelSpec kern;
  Rows rows;
  Queries q;
  float alpha;
  float* kept;  // (N, B): the scores, for the backward pass; nullptr when not kept
};

// One part's sums of the backward pass (summed by the driver).
struct BwdAcc {
  float* qt;      // (G, d_in, W): Σ_i s̄_i k_i, transposed
  float* rowsum;  // (G, W): Σ_i s̄_i (neg_sqdist)
  double* ssum;   // Σ s̄ s over valid lanes
};

struct BwdCall {
  KernelSpec kern;
  Rows rows;
  Queries q;
  float alpha;
  const float* m;      // (G, W): the forward pass's stabiliser (0 past B)
  const float* nbt;    // (G, d_out, W): ∂L/∂num transposed
  const float* nbp;    // (G, W, d_out_pad): ∂L/∂num by lane (row gradients), or nullptr
  int64_t d_out_pad;
  const float* dbar;   // (G, W): ∂L/∂den
  const float* kept;   // (N, B) scores kept by the forward pass, or nullptr (computed again from k)
  float* kbar;         // (N, d_in) or nullptr (no row gradients)
  float* vbar;         // (N, d_out) or nullptr
  float* wbar;         // (N,) or nullptr (also without a denominator)
};

// One instruction set's bodies. Each processes rows [lo, hi) (whole blocks but the last) into the
// accumulators of one part, using `scratch` (scratch_floats(...) floats, 64-byte aligned).
struct Isa {
  const char* name;
  int lanes;  // W
  int64_t (*scratch_floats)(int64_t d_in, int64_t d_out, int64_t groups);
  void (*fwd_part)(const FwdCall& call, int64_t lo, int64_t hi, const FwdAcc& acc, float* scratch);
  void (*bwd_part)(const BwdCall& call, int64_t lo, int64_t hi, const BwdAcc& acc, float* scratch);
};

// nullptr where this build lacks the instruction set (not x86-64); whether the CPU runs it is checked
// by the driver (growmem_native.cc: cpu_has)
const Isa* isa_avx512();
const Isa* isa_avx2();
const Isa* isa_generic();

}  // namespace growmem
