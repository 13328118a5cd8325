// growmem._native: the fused CPU retrieval kernel behind growmem.kernels.reduce, as two typed XLA
// FFI targets (growmem/native.py registers and calls them):
//
//   growmem_reduce_fwd  (q, k, v, w, c, size, α) -> (m, num, den, kept scores)    the forward pass
//   growmem_reduce_bwd  (q, k, v, w, c, size, α, m, ∂num, ∂den, kept)
//                        -> (∂q, Σ s̄ s, ∂k, ∂v, ∂w)                                 the backward pass
//
// of kernels.Kernel.fold / unfold over every row below `size` (masking past it), the math of the
// custom VJP in growmem/kernels.py. Rows are float32 or bfloat16 (widened to float32 a block at a
// time); the queries are float32. The rows [0, size) are cut into parts of whole blocks; XLA's
// intra-op thread pool and the calling thread take parts in turn, each part keeps its own partial,
// and the partials are merged in part order (log-sum-exp rule, as kernels.merge), so a result does
// not depend on which thread took which part. The vector width is chosen at run time: AVX-512,
// AVX2 + FMA, or the portable build (the `isa` attribute; growmem.native picks the best the CPU has).
#define PY_SSIZE_T_CLEAN   // "s#" passes the key's length as a Py_ssize_t
#include <Python.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "isa.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// buffer types by rank (aliases: the binding macros below cannot take a comma inside an argument)
using F32Scalar = ffi::Buffer<ffi::F32, 0>;
using F32Vec = ffi::Buffer<ffi::F32, 1>;
using F32Mat = ffi::Buffer<ffi::F32, 2>;
using S32Scalar = ffi::Buffer<ffi::S32, 0>;

namespace growmem {
namespace {

//: a part holds at least this many rows (8 blocks): fewer parts than threads below 2 x this
constexpr int64_t kMinPartRows = 8 * kBlockRows;
//: at most this many parts per thread of the pool: a thread that starts late still finds work
constexpr int64_t kPartsPerThread = 4;

// ------------------------------------------------------------------ instruction sets

bool cpu_has(const char* name) {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (!std::strcmp(name, "avx512"))
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2");
  if (!std::strcmp(name, "avx2"))
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2");
#endif
  return !std::strcmp(name, "generic");
}

// the instruction sets this build has and this CPU runs, best first
std::vector<const Isa*> usable_isas() {
  std::vector<const Isa*> out;
  for (const Isa* isa : {isa_avx512(), isa_avx2(), isa_generic()})
    if (isa != nullptr && cpu_has(isa->name)) out.push_back(isa);
  return out;
}

// what ran, for the tests (growmem.native.stats()): calls per instruction set, in usable_isas() order, and
// how many threads took at least one part in the last call
std::atomic<int64_t> g_calls[3];
std::atomic<int64_t> g_last_workers{0};

void count_call(const Isa* isa) {
  static const std::vector<const Isa*> usable = usable_isas();
  for (size_t i = 0; i < usable.size() && i < 3; ++i)
    if (usable[i] == isa) g_calls[i].fetch_add(1, std::memory_order_relaxed);
}

const Isa* find_isa(std::string_view name) {
  static const std::vector<const Isa*> usable = usable_isas();
  for (const Isa* isa : usable)
    if (name == isa->name) return isa;
  return nullptr;
}

// ------------------------------------------------------------------ scratch memory
// Buffers are reused from call to call (a row-sized malloc per call would map and fault fresh pages
// every step); each call leases what it needs and gives it back.
class Arena {
 public:
  float* get(size_t floats) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      size_t best = free_.size();
      for (size_t i = 0; i < free_.size(); ++i)
        if (free_[i].second >= floats && (best == free_.size() || free_[i].second < free_[best].second)) best = i;
      if (best != free_.size()) {
        float* p = free_[best].first;
        free_.erase(free_.begin() + best);
        return p;
      }
    }
    const size_t bytes = ((floats * sizeof(float) + 63) / 64) * 64;
    void* p = std::aligned_alloc(64, bytes > 0 ? bytes : 64);
    if (p == nullptr) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    sizes_.emplace_back(static_cast<float*>(p), floats);
    return static_cast<float*>(p);
  }
  void put(float* p) {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& s : sizes_)
      if (s.first == p) {
        free_.push_back(s);
        break;
      }
    while (free_.size() > 16) {   // keep the largest few
      auto smallest = std::min_element(free_.begin(), free_.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
      std::free(smallest->first);
      sizes_.erase(std::find(sizes_.begin(), sizes_.end(), *smallest));
      free_.erase(smallest);
    }
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<float*, size_t>> free_, sizes_;
};

Arena& arena() {
  static Arena* a = new Arena();   // never destroyed: calls may run during interpreter shutdown
  return *a;
}

struct Lease {
  float* p = nullptr;
  explicit Lease(size_t floats) : p(arena().get(floats)) {}
  ~Lease() { arena().put(p); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
};

int64_t up16(int64_t n) { return (n + 15) & ~int64_t(15); }

// ------------------------------------------------------------------ parts and threads

struct Parts {
  int64_t n = 0, rows = 0, size = 0;  // n parts of `rows` rows (the last may hold fewer)
  int64_t lo(int64_t p) const { return p * rows; }
  int64_t hi(int64_t p) const { return std::min(size, (p + 1) * rows); }
};

Parts split(int64_t size, int64_t threads) {
  Parts parts;
  parts.size = size;
  if (size <= 0) return parts;
  const int64_t most = std::max<int64_t>(1, kPartsPerThread * std::max<int64_t>(1, threads));
  const int64_t want = std::min(most, std::max<int64_t>(1, size / kMinPartRows));
  int64_t blocks = (size + kBlockRows - 1) / kBlockRows;
  parts.rows = ((blocks + want - 1) / want) * kBlockRows;
  parts.n = (size + parts.rows - 1) / parts.rows;
  return parts;
}

// work(part, slot) for every part, on the calling thread and up to `helpers` threads of XLA's pool;
// `slot` < helpers + 1 names the thread's scratch. Returns when every part is done. A helper that
// starts after the last part was taken returns at once, touching nothing but the shared counters.
template <class F>
void run_parts(ffi::ThreadPool& pool, int64_t nparts, int64_t helpers, F& work) {
  if (nparts <= 0) return;
  if (helpers <= 0 || nparts == 1) {
    for (int64_t p = 0; p < nparts; ++p) work(p, 0);
    g_last_workers.store(1, std::memory_order_relaxed);
    return;
  }
  struct Job {
    std::atomic<int64_t> next{0}, done{0};
    std::atomic<int64_t> slot{0}, workers{0};
  };
  auto job = std::make_shared<Job>();
  const int64_t slots = helpers + 1;
  auto drain = [job, nparts, slots](F* w) {
    const int64_t slot = job->slot.fetch_add(1);
    if (slot >= slots) return;
    bool worked = false;
    for (int64_t p = job->next.fetch_add(1); p < nparts; p = job->next.fetch_add(1)) {
      if (!worked) job->workers.fetch_add(1, std::memory_order_relaxed);
      worked = true;
      (*w)(p, slot);
      job->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([drain, &work] { drain(&work); });
  drain(&work);
  for (int spins = 0; job->done.load(std::memory_order_acquire) < nparts; ++spins) {
    if (spins < 4096) {
#if defined(__x86_64__) || defined(_M_X64)
      __builtin_ia32_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }
  g_last_workers.store(job->workers.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

// the helper threads of a call: up to `threads` - 1 (the calling thread is one), or every thread of XLA's
// pool for threads = 0. The parts do not depend on it: they follow the pool's size, so the merged result
// is the same whichever threads run them
int64_t helpers_for(ffi::ThreadPool& pool, int64_t nparts, int32_t threads) {
  const int64_t most = threads > 0 ? int64_t(threads) - 1 : int64_t(pool.num_threads());
  return std::max<int64_t>(0, std::min<int64_t>(most, nparts - 1));
}

// ------------------------------------------------------------------ decoding and layout

ffi::Error invalid(const std::string& msg) { return ffi::Error::InvalidArgument("growmem native reduce: " + msg); }

struct Decoded {
  KernelSpec kern{};
  Rows rows{};
  const Isa* isa = nullptr;
  int64_t b = 0, n = 0, size = 0;
  float alpha = 0;
};

ffi::Error decode(ffi::Buffer<ffi::F32, 2>& q, ffi::AnyBuffer& k, ffi::AnyBuffer& v, ffi::Buffer<ffi::F32, 1>& w,
                  ffi::Buffer<ffi::F32, 1>& c, ffi::Buffer<ffi::S32, 0>& size, ffi::Buffer<ffi::F32, 0>& alpha,
                  int32_t form, int32_t exponential, int32_t normalised, std::string_view isa, Decoded& out) {
  out.isa = find_isa(isa);
  if (out.isa == nullptr) return invalid("instruction set '" + std::string(isa) + "' is not usable on this CPU");
  if (form != kDot && form != kNegSqdist) return invalid("form must be 0 (dot) or 1 (neg_sqdist)");
  out.kern = KernelSpec{form, exponential != 0, normalised != 0};
  const auto kd = k.dimensions(), vd = v.dimensions();
  if (kd.size() != 2 || vd.size() != 2) return invalid("k and v must be 2-D");
  for (auto* a : {&k, &v})
    if (a->element_type() != ffi::F32 && a->element_type() != ffi::BF16)
      return invalid("rows must be float32 or bfloat16");
  out.b = q.dimensions()[0];
  out.n = kd[0];
  if (q.dimensions()[1] != kd[1]) return invalid("key dimension does not match the queries");
  if (vd[0] != out.n) return invalid("k and v disagree on the number of rows");
  const int64_t wn = w.dimensions()[0], cn = c.dimensions()[0];
  if (out.kern.normalised ? wn != out.n : wn != 0) return invalid("w must have one entry per row (normalised kernels) or none");
  if (cn != 0 && cn != out.n) return invalid("c must have one entry per row, or none");
  out.rows = Rows{k.untyped_data(), k.element_type() == ffi::BF16, kd[1],
                  v.untyped_data(), v.element_type() == ffi::BF16, vd[1],
                  out.kern.normalised ? w.typed_data() : nullptr, cn ? c.typed_data() : nullptr};
  out.size = std::clamp<int64_t>(size.typed_data()[0], 0, out.n);
  out.alpha = alpha.typed_data()[0];
  return ffi::Error::Success();
}

// (B, d) queries laid out per group of W lanes: qt (G, d, W), with `q2` (G, W) their squared norms,
// with `qp` (G, W, dpad) their rows padded; zero past B and past d
void layout_queries(const float* q, int64_t b, int64_t d, int W, float* qt, float* q2, float* qp, int64_t dpad) {
  const int64_t G = (b + W - 1) / W;
  std::memset(qt, 0, sizeof(float) * G * d * W);
  if (q2) std::memset(q2, 0, sizeof(float) * G * W);
  if (qp) std::memset(qp, 0, sizeof(float) * G * W * dpad);
  for (int64_t r = 0; r < b; ++r) {
    const int64_t g = r / W, l = r % W;
    float s = 0;
    for (int64_t j = 0; j < d; ++j) {
      const float x = q[r * d + j];
      qt[(g * d + j) * W + l] = x;
      s += x * x;
    }
    if (q2) q2[g * W + l] = s;
    if (qp) std::memcpy(qp + (g * W + l) * dpad, q + r * d, sizeof(float) * d);
  }
}

// ------------------------------------------------------------------ forward

ffi::Error ReduceFwdImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32, 2> q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                         ffi::Buffer<ffi::F32, 1> w, ffi::Buffer<ffi::F32, 1> c, ffi::Buffer<ffi::S32, 0> size,
                         ffi::Buffer<ffi::F32, 0> alpha, ffi::ResultBuffer<ffi::F32, 1> m_out,
                         ffi::ResultBuffer<ffi::F32, 2> num_out, ffi::ResultBuffer<ffi::F32, 1> den_out,
                         ffi::ResultBuffer<ffi::F32, 1> kept_out, int32_t form, int32_t exponential,
                         int32_t normalised, std::string_view isa_name,
                         int32_t threads) {
  Decoded a;
  if (ffi::Error e = decode(q, k, v, w, c, size, alpha, form, exponential, normalised, isa_name, a); e.failure())
    return e;
  const int64_t B = a.b, din = a.rows.d_in, dout = a.rows.d_out, W = a.isa->lanes, G = (B + W - 1) / W;
  const bool keep = kept_out->dimensions()[0] != 0;
  if (keep && kept_out->dimensions()[0] != a.n * B) return invalid("kept scores must hold N x B entries, or none");
  if (num_out->dimensions()[0] != B || num_out->dimensions()[1] != dout) return invalid("num must be (B, d_out)");
  const bool stabilised = a.kern.exponential && a.kern.normalised;

  const Parts parts = split(a.size, pool.num_threads());
  const int64_t helpers = helpers_for(pool, parts.n, threads);
  count_call(a.isa);
  const int64_t acc_floats = 2 * up16(G * W) + up16(G * dout * W);
  const int64_t scratch_floats = up16(a.isa->scratch_floats(din, dout, G));
  const int64_t total = up16(G * din * W) + up16(G * W) + parts.n * acc_floats + (helpers + 1) * scratch_floats;
  Lease mem(total);
  if (mem.p == nullptr) return ffi::Error(ffi::ErrorCode::kResourceExhausted, "growmem native reduce: out of memory");
  float* qt = mem.p;
  float* q2 = qt + up16(G * din * W);
  float* accs = q2 + up16(G * W);
  float* scratch = accs + parts.n * acc_floats;
  layout_queries(q.typed_data(), B, din, int(W), qt, q2, nullptr, 0);

  FwdCall call{a.kern, a.rows, Queries{B, G, qt, q2, nullptr, 0}, a.alpha, keep ? kept_out->typed_data() : nullptr};
  auto acc_of = [&](int64_t p) {
    float* base = accs + p * acc_floats;
    return FwdAcc{base, base + up16(G * W), base + 2 * up16(G * W)};
  };
  auto work = [&](int64_t p, int64_t slot) {
    a.isa->fwd_part(call, parts.lo(p), parts.hi(p), acc_of(p), scratch + slot * scratch_floats);
  };
  run_parts(pool, parts.n, helpers, work);

  // merge the parts in order: m = max_p m_p, r_p = e^{m_p − m} (0 for a part with m_p = −inf)
  float* m = m_out->typed_data();
  float* num = num_out->typed_data();
  float* den = den_out->typed_data();
  std::vector<float> r(std::max<int64_t>(parts.n, 1));
  for (int64_t row = 0; row < B; ++row) {
    const int64_t g = row / W, l = row % W;
    float mm = stabilised ? -std::numeric_limits<float>::infinity() : 0.0f;
    for (int64_t p = 0; p < parts.n; ++p) mm = std::max(mm, acc_of(p).m[g * W + l]);
    const float safe = std::isfinite(mm) ? mm : 0.0f;
    float dsum = 0;
    for (int64_t p = 0; p < parts.n; ++p) {
      const float mp = acc_of(p).m[g * W + l];
      r[p] = std::isfinite(mp) ? std::exp(mp - safe) : 0.0f;
      dsum += r[p] * acc_of(p).den[g * W + l];
    }
    m[row] = mm;
    den[row] = a.kern.normalised ? dsum : 0.0f;
    for (int64_t j = 0; j < dout; ++j) {
      float s = 0;
      for (int64_t p = 0; p < parts.n; ++p) s += r[p] * acc_of(p).zt[(g * dout + j) * W + l];
      num[row * dout + j] = s;
    }
  }
  return ffi::Error::Success();
}

// ------------------------------------------------------------------ backward

ffi::Error ReduceBwdImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32, 2> q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                         ffi::Buffer<ffi::F32, 1> w, ffi::Buffer<ffi::F32, 1> c, ffi::Buffer<ffi::S32, 0> size,
                         ffi::Buffer<ffi::F32, 0> alpha, ffi::Buffer<ffi::F32, 1> m_in,
                         ffi::Buffer<ffi::F32, 2> num_bar, ffi::Buffer<ffi::F32, 1> den_bar,
                         ffi::Buffer<ffi::F32, 1> kept, ffi::ResultBuffer<ffi::F32, 2> qbar_out,
                         ffi::ResultBuffer<ffi::F32, 0> ssum_out, ffi::ResultBuffer<ffi::F32, 1> kbar_out,
                         ffi::ResultBuffer<ffi::F32, 1> vbar_out, ffi::ResultBuffer<ffi::F32, 1> wbar_out,
                         int32_t form, int32_t exponential, int32_t normalised, std::string_view isa_name,
                         int32_t threads) {
  Decoded a;
  if (ffi::Error e = decode(q, k, v, w, c, size, alpha, form, exponential, normalised, isa_name, a); e.failure())
    return e;
  const int64_t B = a.b, N = a.n, din = a.rows.d_in, dout = a.rows.d_out, W = a.isa->lanes, G = (B + W - 1) / W;
  if (m_in.dimensions()[0] != B || den_bar.dimensions()[0] != B) return invalid("m and den_bar must be (B,)");
  if (num_bar.dimensions()[0] != B || num_bar.dimensions()[1] != dout) return invalid("num_bar must be (B, d_out)");
  const bool has_kept = kept.dimensions()[0] != 0;
  if (has_kept && kept.dimensions()[0] != N * B) return invalid("kept scores must hold N x B entries, or none");
  const bool row_grads = kbar_out->dimensions()[0] != 0;
  if (row_grads && (kbar_out->dimensions()[0] != N * din || vbar_out->dimensions()[0] != N * dout))
    return invalid("row gradients must be (N * d_in,) and (N * d_out,), or none");
  const bool has_wbar = row_grads && a.kern.normalised;
  if (wbar_out->dimensions()[0] != (has_wbar ? N : 0)) return invalid("w gradient must be (N,) or none");

  const Parts parts = split(a.size, pool.num_threads());
  const int64_t helpers = helpers_for(pool, parts.n, threads);
  count_call(a.isa);
  const int64_t dinp = up16(din), doutp = up16(dout);   // rows padded to a multiple of every vector width
  const int64_t acc_floats = up16(G * din * W) + up16(G * W) + 16;
  const int64_t scratch_floats = up16(a.isa->scratch_floats(din, dout, G));
  const int64_t layout = up16(G * din * W) + up16(G * W) + (row_grads ? up16(G * W * dinp) : 0) + up16(G * W) +
                         up16(G * dout * W) + up16(G * W) + (row_grads ? up16(G * W * doutp) : 0);
  Lease mem(layout + parts.n * acc_floats + (helpers + 1) * scratch_floats);
  if (mem.p == nullptr) return ffi::Error(ffi::ErrorCode::kResourceExhausted, "growmem native reduce: out of memory");
  float* p = mem.p;
  float* qt = p; p += up16(G * din * W);
  float* q2 = p; p += up16(G * W);
  float* qp = nullptr;
  if (row_grads) { qp = p; p += up16(G * W * dinp); }
  float* mg = p; p += up16(G * W);
  float* nbt = p; p += up16(G * dout * W);
  float* dbar = p; p += up16(G * W);
  float* nbp = nullptr;
  if (row_grads) { nbp = p; p += up16(G * W * doutp); }
  float* accs = p; p += parts.n * acc_floats;
  float* scratch = p;

  layout_queries(q.typed_data(), B, din, int(W), qt, q2, qp, dinp);
  layout_queries(num_bar.typed_data(), B, dout, int(W), nbt, nullptr, nbp, doutp);
  std::memset(mg, 0, sizeof(float) * G * W);
  std::memset(dbar, 0, sizeof(float) * G * W);
  for (int64_t r = 0; r < B; ++r) {
    mg[r] = m_in.typed_data()[r];   // (G, W) flattened is the row index: lane l of group g is row g·W + l
    dbar[r] = den_bar.typed_data()[r];
  }

  BwdCall call{a.kern, a.rows, Queries{B, G, qt, q2, qp, dinp}, a.alpha, mg, nbt, nbp, doutp, dbar,
               has_kept ? kept.typed_data() : nullptr,
               row_grads ? kbar_out->typed_data() : nullptr, row_grads ? vbar_out->typed_data() : nullptr,
               has_wbar ? wbar_out->typed_data() : nullptr};
  auto acc_of = [&](int64_t part) {
    float* base = accs + part * acc_floats;
    return BwdAcc{base, base + up16(G * din * W), reinterpret_cast<double*>(base + up16(G * din * W) + up16(G * W))};
  };
  auto work = [&](int64_t part, int64_t slot) {
    a.isa->bwd_part(call, parts.lo(part), parts.hi(part), acc_of(part), scratch + slot * scratch_floats);
  };
  run_parts(pool, parts.n, helpers, work);

  // sum the parts in order; ∂q = α Σ s̄ k, or 2α(Σ s̄ k − q Σ s̄) (neg_sqdist)
  const bool neg = a.kern.form == kNegSqdist;
  float* qbar = qbar_out->typed_data();
  const float* qd = q.typed_data();
  double ssum = 0;
  for (int64_t part = 0; part < parts.n; ++part) ssum += *acc_of(part).ssum;
  for (int64_t row = 0; row < B; ++row) {
    const int64_t g = row / W, l = row % W;
    float rs = 0;
    for (int64_t part = 0; part < parts.n; ++part) rs += acc_of(part).rowsum[g * W + l];
    for (int64_t j = 0; j < din; ++j) {
      float s = 0;
      for (int64_t part = 0; part < parts.n; ++part) s += acc_of(part).qt[(g * din + j) * W + l];
      qbar[row * din + j] = neg ? 2.0f * a.alpha * (s - qd[row * din + j] * rs) : a.alpha * s;
    }
  }
  ssum_out->typed_data()[0] = float(ssum);
  if (row_grads) {   // rows past `size` get no gradient
    std::memset(kbar_out->typed_data() + a.size * din, 0, sizeof(float) * (N - a.size) * din);
    std::memset(vbar_out->typed_data() + a.size * dout, 0, sizeof(float) * (N - a.size) * dout);
    if (has_wbar) std::memset(wbar_out->typed_data() + a.size, 0, sizeof(float) * (N - a.size));
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace growmem

namespace growmem {
namespace {

// the operands both passes share: the rows, size and α
auto bind_rows() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<F32Mat>()          // q
      .Arg<ffi::AnyBuffer>()  // k
      .Arg<ffi::AnyBuffer>()  // v
      .Arg<F32Vec>()          // w
      .Arg<F32Vec>()          // c
      .Arg<S32Scalar>()       // size
      .Arg<F32Scalar>();      // alpha
}

// the kernel of the table, the instruction set and the most threads a call uses (0: XLA's pool)
template <class B>
auto bind_kernel(B binding) {
  return std::move(binding)
      .template Attr<int32_t>("form")
      .template Attr<int32_t>("exponential")
      .template Attr<int32_t>("normalised")
      .template Attr<std::string_view>("isa")
      .template Attr<int32_t>("threads");
}

}  // namespace
}  // namespace growmem

XLA_FFI_DEFINE_HANDLER_SYMBOL(GrowmemReduceFwd, growmem::ReduceFwdImpl,
                              growmem::bind_kernel(growmem::bind_rows()
                                                       .Ret<F32Vec>()    // m
                                                       .Ret<F32Mat>()    // num
                                                       .Ret<F32Vec>()    // den
                                                       .Ret<F32Vec>())); // kept scores, (N·B,) or (0,)

XLA_FFI_DEFINE_HANDLER_SYMBOL(GrowmemReduceBwd, growmem::ReduceBwdImpl,
                              growmem::bind_kernel(growmem::bind_rows()
                                                       .Arg<F32Vec>()    // m
                                                       .Arg<F32Mat>()    // ∂num
                                                       .Arg<F32Vec>()    // ∂den
                                                       .Arg<F32Vec>()    // kept scores, (N·B,) or (0,)
                                                       .Ret<F32Mat>()    // ∂q
                                                       .Ret<F32Scalar>() // Σ s̄ s
                                                       .Ret<F32Vec>()    // ∂k, (N·d_in,) or (0,)
                                                       .Ret<F32Vec>()    // ∂v, (N·d_out,) or (0,)
                                                       .Ret<F32Vec>())); // ∂w, (N,) or (0,)

// ------------------------------------------------------------------ cold-tier reads

// A spilled layer's cold chunk, read on the host by the Python function set_cold_reader registered
// (growmem.backends.tiered: the tier's files, read-ahead, ageing). The same job as a jax.pure_callback,
// but a custom call names no Python object, so XLA's persistent compilation cache keeps the programs
// that read cold rows (a resumed spilling run does not compile them again).
namespace growmem {
namespace {

PyObject* g_cold_reader = nullptr;   // owned reference; set by growmem.native.cold_reads (under the GIL)

// the Python exception being raised, as "Type: message" (cleared)
std::string python_error() {
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  std::string out = "unknown error";
  if (value != nullptr) {
    PyObject* name = type != nullptr ? PyObject_GetAttrString(type, "__name__") : nullptr;
    PyObject* text = PyObject_Str(value);
    const char* n = name != nullptr ? PyUnicode_AsUTF8(name) : nullptr;
    const char* t = text != nullptr ? PyUnicode_AsUTF8(text) : nullptr;
    out = std::string(n != nullptr ? n : "Exception") + ": " + (t != nullptr ? t : "");
    Py_XDECREF(name);
    Py_XDECREF(text);
  }
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  return out;
}

// reader(key, i, n, t, shard, fields) returns one C-contiguous array per result, of exactly its bytes
std::string cold_read(const ffi::Buffer<ffi::S32>& i, const ffi::Buffer<ffi::S32>& n, const ffi::Buffer<ffi::S32>& t,
                      const ffi::Buffer<ffi::S32>& shard, std::string_view key, int32_t fields,
                      ffi::RemainingRets& outs) {
  if (g_cold_reader == nullptr) return "no cold reader is registered (growmem.native.cold_reads registers it)";
  PyObject* res = PyObject_CallFunction(g_cold_reader, "s#iiiii", key.data(), Py_ssize_t(key.size()),
                                        int(i.typed_data()[0]), int(n.typed_data()[0]), int(t.typed_data()[0]),
                                        int(shard.typed_data()[0]), int(fields));
  if (res == nullptr) return python_error();
  std::string err;
  if (!PyTuple_Check(res) || size_t(PyTuple_GET_SIZE(res)) != outs.size()) {
    err = "the cold reader returned " + std::string(Py_TYPE(res)->tp_name) + ", not a tuple of " +
          std::to_string(outs.size()) + " arrays";
  }
  for (size_t j = 0; err.empty() && j < outs.size(); ++j) {
    auto out = outs.get<ffi::AnyBuffer>(j);
    if (!out.has_value()) {
      err = "cold read result " + std::to_string(j) + ": " + out.error().message();
      break;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(res, Py_ssize_t(j)), &view, PyBUF_C_CONTIGUOUS) != 0) {
      err = python_error();
      break;
    }
    const size_t want = (*out)->size_bytes();
    if (size_t(view.len) != want) {
      err = "cold read result " + std::to_string(j) + " has " + std::to_string(view.len) + " bytes, expected " +
            std::to_string(want);
    } else {
      std::memcpy((*out)->untyped_data(), view.buf, want);
    }
    PyBuffer_Release(&view);
  }
  Py_DECREF(res);
  return err;
}

ffi::Error ColdReadImpl(ffi::Buffer<ffi::S32> i, ffi::Buffer<ffi::S32> n, ffi::Buffer<ffi::S32> t,
                        ffi::Buffer<ffi::S32> shard, std::string_view key, int32_t fields, ffi::RemainingRets outs) {
  const PyGILState_STATE gil = PyGILState_Ensure();   // XLA runs the call without the GIL
  const std::string err = cold_read(i, n, t, shard, key, fields, outs);
  PyGILState_Release(gil);
  if (!err.empty()) return ffi::Error(ffi::ErrorCode::kInternal, "growmem cold read of " + std::string(key) + ": " + err);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace growmem

XLA_FFI_DEFINE_HANDLER_SYMBOL(GrowmemColdRead, growmem::ColdReadImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()   // i: the chunk
                                  .Arg<ffi::Buffer<ffi::S32>>()   // n: cold rows readable
                                  .Arg<ffi::Buffer<ffi::S32>>()   // t: the step the rows are aged to
                                  .Arg<ffi::Buffer<ffi::S32>>()   // shard
                                  .Attr<std::string_view>("key")  // the tier (growmem.backends.tiered._STORES)
                                  .Attr<int32_t>("fields")        // bit f: FIELDS[f] read
                                  .RemainingRets());              // one array per field read

// ------------------------------------------------------------------ the Python module

namespace {

PyObject* targets(PyObject*, PyObject*) {
  PyObject* d = PyDict_New();
  if (d == nullptr) return nullptr;
  const std::pair<const char*, void*> items[] = {{"growmem_reduce_fwd", reinterpret_cast<void*>(GrowmemReduceFwd)},
                                                 {"growmem_reduce_bwd", reinterpret_cast<void*>(GrowmemReduceBwd)},
                                                 {"growmem_cold_read", reinterpret_cast<void*>(GrowmemColdRead)}};
  for (const auto& [name, fn] : items) {
    PyObject* cap = PyCapsule_New(fn, nullptr, nullptr);
    if (cap == nullptr || PyDict_SetItemString(d, name, cap) != 0) {
      Py_XDECREF(cap);
      Py_DECREF(d);
      return nullptr;
    }
    Py_DECREF(cap);
  }
  return d;
}

PyObject* isas(PyObject*, PyObject*) {
  const std::vector<const growmem::Isa*> usable = growmem::usable_isas();
  PyObject* t = PyTuple_New(Py_ssize_t(usable.size()));
  if (t == nullptr) return nullptr;
  for (size_t i = 0; i < usable.size(); ++i) {
    PyObject* pair = Py_BuildValue("(si)", usable[i]->name, usable[i]->lanes);
    if (pair == nullptr) {
      Py_DECREF(t);
      return nullptr;
    }
    PyTuple_SET_ITEM(t, Py_ssize_t(i), pair);
  }
  return t;
}

PyObject* stats(PyObject*, PyObject*) {
  const std::vector<const growmem::Isa*> usable = growmem::usable_isas();
  PyObject* calls = PyDict_New();
  if (calls == nullptr) return nullptr;
  for (size_t i = 0; i < usable.size() && i < 3; ++i) {
    PyObject* n = PyLong_FromLongLong(growmem::g_calls[i].load());
    if (n == nullptr || PyDict_SetItemString(calls, usable[i]->name, n) != 0) {
      Py_XDECREF(n);
      Py_DECREF(calls);
      return nullptr;
    }
    Py_DECREF(n);
  }
  return Py_BuildValue("{sNsL}", "calls", calls, "last_workers", static_cast<long long>(growmem::g_last_workers.load()));
}

PyObject* set_cold_reader(PyObject*, PyObject* fn) {
  if (!PyCallable_Check(fn)) {
    PyErr_SetString(PyExc_TypeError, "set_cold_reader needs a callable");
    return nullptr;
  }
  Py_INCREF(fn);
  PyObject* old = growmem::g_cold_reader;
  growmem::g_cold_reader = fn;
  Py_XDECREF(old);
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"targets", targets, METH_NOARGS, "{name: PyCapsule} of the XLA FFI handlers (register for platform 'cpu')."},
    {"isas", isas, METH_NOARGS, "((name, lanes), ...): the instruction sets this build has and this CPU runs, best first."},
    {"set_cold_reader", set_cold_reader, METH_O,
     "set_cold_reader(fn): fn(key, i, n, t, shard, fields) -> arrays, the host side of growmem_cold_read."},
    {"stats", stats, METH_NOARGS, "{'calls': {isa: passes run}, 'last_workers': threads that took a part in the last pass}."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "growmem's fused CPU retrieval kernel (XLA FFI targets).",
                      -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
