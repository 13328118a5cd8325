// The vectorised bodies of the native retrieval kernel, written once over a vector type V (W float
// lanes, one per query of a group) and instantiated by each isa_*.cc inside an anonymous namespace
// (compiled for that instruction set; nothing here has external linkage).
//
// V provides: W, RA and UA (rows and columns per step of a score pass), JB (columns per accumulation
// pass), zero, set1, load,
// store, load_n / store_n (the first n lanes), fma(a, b, c) = a·b + c, + − ·, max, exp, sum (of the
// lanes), any_gt, keep (lanes < n, the rest 0 exactly), widen (bfloat16 bits -> float32).
//
// Three products, each reading a block's rows once per query group:
//   dot_rows   S[i][l] = Σ_j X[i][j] Yt[j][l]     scores ⟨k_i, q_l⟩ and, backward, ⟨v_i, ∂num_l⟩
//   acc_cols   Zt[j][l] += Σ_i X[i][j] E[i][l]    num (X = v, E = e) and, backward, Σ s̄ k (X = k)
//   lanes_rows O[i][j] = Σ_l C[i][l] Y[l][j]      the row gradients ∂k, ∂v
// The first two broadcast one element of a row against a vector of W queries; the third broadcasts
// a per-(row, query) coefficient against W columns of a query's vector.

// The next block's rows (of one array), fetched into L2 a cache line at a time from inside the
// products' loops — a block's products take about as many iterations as the next block has lines —
// so that reading the rows overlaps the arithmetic instead of following it.
struct Prefetch {
  const char* p = nullptr;
  const char* end = nullptr;
};

static constexpr float kTiny = 1e-30f;  // floor on |c·w| in the stabiliser (growmem.kernels._TINY)
static constexpr float kNegInf = -__builtin_inff();

template <class V>
struct Impl {
  static constexpr int W = V::W;
  static constexpr int64_t RB = growmem::kBlockRows;

  static int64_t up16(int64_t n) { return (n + 15) & ~int64_t(15); }

  // ------------------------------------------------------------------ the three products
  // R rows at a time, the columns U at a time: R·U accumulators (enough to cover the latency of the
  // multiply-adds) from R row pointers (few enough for the general registers)
  template <int R>
  static inline const char* dot_rows_r(const float* X, int64_t ldx, const float* Yt, int64_t d, float* out, bool add,
                                       const char* pf, const char* pf_end) {
    constexpr int U = V::UA;
    V acc[U][R];
#pragma GCC unroll 16
    for (int u = 0; u < U; ++u)
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[u][r] = (u == 0 && add) ? V::load(out + r * W) : V::zero();
    const float* x[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) x[r] = X + r * ldx;
    int64_t j = 0;
    for (; j + U <= d; j += U) {
      if (pf < pf_end) {
        __builtin_prefetch(pf, 0, 2);
        pf += 64;
      }
#pragma GCC unroll 16
      for (int u = 0; u < U; ++u) {
        const V y = V::load(Yt + (j + u) * W);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[u][r] = V::fma(V::set1(x[r][j + u]), y, acc[u][r]);
      }
    }
    for (; j < d; ++j) {
      const V y = V::load(Yt + j * W);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[0][r] = V::fma(V::set1(x[r][j]), y, acc[0][r]);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      V t = acc[0][r];
#pragma GCC unroll 16
      for (int u = 1; u < U; ++u) t = t + acc[u][r];
      t.store(out + r * W);
    }
    return pf;
  }

  template <int R>
  static inline const char* dot_rows_tail(int r, const float* X, int64_t ldx, const float* Yt, int64_t d, float* out,
                                          bool add, const char* pf, const char* pf_end) {
    if (r == R) return dot_rows_r<R>(X, ldx, Yt, d, out, add, pf, pf_end);
    if constexpr (R > 1) return dot_rows_tail<R - 1>(r, X, ldx, Yt, d, out, add, pf, pf_end);
    return pf;
  }

  //: columns per panel of a score pass: a panel of Yt (DP x W floats) stays in L1 while every row
  //: of the block meets it (d = 784 at once, 50 KB at W = 16, does not)
  static constexpr int64_t DP = 256;

  // S (nb, W) for the rows X (nb, d) against Yt (d, W)
  static void dot_rows(const float* X, int64_t ldx, int64_t nb, const float* Yt, int64_t d, float* S, Prefetch& pf) {
    const char* p = pf.p;
    for (int64_t j0 = 0; j0 < d; j0 += DP) {
      const int64_t dp = d - j0 < DP ? d - j0 : DP;
      const bool add = j0 > 0;
      int64_t i = 0;
      for (; i + V::RA <= nb; i += V::RA)
        p = dot_rows_r<V::RA>(X + i * ldx + j0, ldx, Yt + j0 * W, dp, S + i * W, add, p, pf.end);
      if (i < nb)
        p = dot_rows_tail<V::RA - 1>(int(nb - i), X + i * ldx + j0, ldx, Yt + j0 * W, dp, S + i * W, add, p, pf.end);
    }
    pf.p = p;
  }

  template <int J>
  static inline const char* acc_cols_j(const float* X, int64_t ldx, int64_t nb, const float* E, float* Zt,
                                       const char* pf, const char* pf_end) {
    V acc[J];
#pragma GCC unroll 32
    for (int t = 0; t < J; ++t) acc[t] = V::load(Zt + t * W);
    for (int64_t i = 0; i < nb; ++i) {
      if (pf < pf_end) {   // two lines an iteration: an iteration reads up to JB floats
        __builtin_prefetch(pf, 0, 2);
        __builtin_prefetch(pf + 64, 0, 2);
        pf += 128;
      }
      const V e = V::load(E + i * W);
      const float* x = X + i * ldx;
#pragma GCC unroll 32
      for (int t = 0; t < J; ++t) acc[t] = V::fma(V::set1(x[t]), e, acc[t]);
    }
#pragma GCC unroll 32
    for (int t = 0; t < J; ++t) acc[t].store(Zt + t * W);
    return pf;
  }

  template <int J>
  static inline const char* acc_cols_tail(int j, const float* X, int64_t ldx, int64_t nb, const float* E, float* Zt,
                                          const char* pf, const char* pf_end) {
    if (j == J) return acc_cols_j<J>(X, ldx, nb, E, Zt, pf, pf_end);
    if constexpr (J > 1) return acc_cols_tail<J - 1>(j, X, ldx, nb, E, Zt, pf, pf_end);
    return pf;
  }

  // Zt (d, W) += Xᵀ E for the rows X (nb, d) and E (nb, W)
  static void acc_cols(const float* X, int64_t ldx, int64_t nb, int64_t d, const float* E, float* Zt, Prefetch& pf) {
    const char* p = pf.p;
    int64_t j = 0;
    for (; j + V::JB <= d; j += V::JB) p = acc_cols_j<V::JB>(X + j, ldx, nb, E, Zt + j * W, p, pf.end);
    if (j < d) p = acc_cols_tail<V::JB - 1>(int(d - j), X + j, ldx, nb, E, Zt + j * W, p, pf.end);
    pf.p = p;
  }

  // O[i][:] = scale · Σ_g Σ_l C[g][i][l] Y[g][l][:]  (+ xcoef[i] · Xr[i][:] when Xr): rows i < nb,
  // C (G, RB, W), Y (G, W, dpad) zero past d, O (nb, d)
  static void lanes_rows(const float* C, int64_t G, const float* Y, int64_t dpad, int64_t d, float scale,
                         const float* Xr, int64_t ldx, const float* xcoef, int64_t nb, float* O) {
    for (int64_t i = 0; i < nb; ++i) {
      for (int64_t j = 0; j < d; j += W) {
        V acc = V::zero();
        for (int64_t g = 0; g < G; ++g) {
          const float* c = C + (g * RB + i) * W;
          const float* y = Y + g * W * dpad + j;
#pragma GCC unroll 16
          for (int l = 0; l < W; ++l) acc = V::fma(V::set1(c[l]), V::load(y + l * dpad), acc);
        }
        acc = acc * V::set1(scale);
        const int n = int(d - j < W ? d - j : W);
        if (Xr) acc = V::fma(V::set1(xcoef[i]), V::load_n(Xr + i * ldx + j, n), acc);
        if (n == W) {
          acc.store(O + i * d + j);
        } else {
          acc.store_n(O + i * d + j, n);
        }
      }
    }
  }

  // ------------------------------------------------------------------ rows as float32
  // A block's rows as float32: the rows themselves (float32), or widened into `buf` (bfloat16)
  static const float* rows_f32(const void* base, bool bf16, int64_t r0, int64_t nb, int64_t d, float* buf) {
    if (!bf16) return static_cast<const float*>(base) + r0 * d;
    V::widen(static_cast<const uint16_t*>(base) + r0 * d, buf, nb * d);
    return buf;
  }

  // rows [r0, r1) of a table of d-wide rows (bfloat16 or float32), for Prefetch
  static Prefetch rows_ahead(const void* base, bool bf16, int64_t d, int64_t r0, int64_t r1) {
    const int64_t width = bf16 ? 2 : 4;
    const char* b = static_cast<const char*>(base);
    return r1 > r0 ? Prefetch{b + r0 * d * width, b + r1 * d * width} : Prefetch{};
  }

  static float sumsq(const float* x, int64_t d) {
    V acc = V::zero();
    int64_t j = 0;
    for (; j + W <= d; j += W) {
      const V a = V::load(x + j);
      acc = V::fma(a, a, acc);
    }
    float s = V::sum(acc);
    for (; j < d; ++j) s += x[j] * x[j];
    return s;
  }

  // scores of one group from raw dot products, in place: s = α qk, or s = −α max(‖q‖² + ‖k‖² − 2qk, 0)
  static void finish_scores(const growmem::KernelSpec& kern, float alpha, const float* q2, const float* k2,
                            int64_t nb, float* S) {
    const V a = V::set1(alpha);
    if (kern.form == growmem::kDot) {
      for (int64_t i = 0; i < nb; ++i) (V::load(S + i * W) * a).store(S + i * W);
      return;
    }
    const V qq = V::load(q2), two = V::set1(2.0f), zero = V::zero(), na = V::set1(-alpha);
    for (int64_t i = 0; i < nb; ++i) {
      const V d2 = V::max(zero, qq + V::set1(k2[i]) - two * V::load(S + i * W));
      (na * d2).store(S + i * W);
    }
  }

  static int lanes_of(const growmem::Queries& q, int64_t g) {
    const int64_t n = q.b - g * W;
    return int(n < W ? n : W);
  }

  // ------------------------------------------------------------------ scratch
  // kw (RB, d_in), vw (RB, d_out), k2 (RB), logcw (RB), S (RB, W), E / s̄ (G, RB, W) x 2, rs (RB)
  static int64_t scratch_floats(int64_t d_in, int64_t d_out, int64_t groups) {
    return up16(RB * d_in) + up16(RB * d_out) + 3 * up16(RB) + up16(RB * W) + 2 * up16(groups * RB * W) + 64;
  }

  struct Scratch {
    float *kw, *vw, *k2, *logcw, *rs, *S, *E, *SB;
    Scratch(float* p, int64_t d_in, int64_t d_out, int64_t groups) {
      kw = p; p += up16(RB * d_in);
      vw = p; p += up16(RB * d_out);
      k2 = p; p += up16(RB);
      logcw = p; p += up16(RB);
      rs = p; p += up16(RB);
      S = p; p += up16(RB * W);
      E = p; p += up16(groups * RB * W);
      SB = p;
    }
  };

  // One block of rows [r0, r0 + nb) as float32 (‖k‖² in s.k2 when `norms`), and the next block's
  // rows to prefetch while it is processed
  struct Block {
    int64_t r0, nb;
    const float *k, *v;
    Prefetch pk, pv;
    Block(const growmem::Rows& rows, int64_t r0_, int64_t hi, const Scratch& s, bool norms) : r0(r0_) {
      nb = hi - r0 < RB ? hi - r0 : RB;
      const int64_t n1 = r0 + nb + RB < hi ? r0 + nb + RB : hi;   // the next block: [r0 + nb, n1)
      pk = rows_ahead(rows.k, rows.k_bf16, rows.d_in, r0 + nb, n1);
      pv = rows_ahead(rows.v, rows.v_bf16, rows.d_out, r0 + nb, n1);
      k = rows_f32(rows.k, rows.k_bf16, r0, nb, rows.d_in, s.kw);
      v = rows_f32(rows.v, rows.v_bf16, r0, nb, rows.d_out, s.vw);
      if (norms)
        for (int64_t i = 0; i < nb; ++i) s.k2[i] = sumsq(k + i * rows.d_in, rows.d_in);
    }
  };

  // ------------------------------------------------------------------ forward
  static void fwd_part(const growmem::FwdCall& call, int64_t lo, int64_t hi, const growmem::FwdAcc& acc,
                       float* scratch) {
    const growmem::KernelSpec& kern = call.kern;
    const growmem::Rows& rows = call.rows;
    const growmem::Queries& q = call.q;
    const int64_t din = rows.d_in, dout = rows.d_out, G = q.groups;
    const bool stabilised = kern.exponential && kern.normalised;
    Scratch s(scratch, din, dout, G);
    for (int64_t g = 0; g < G; ++g) {
      V::set1(stabilised ? kNegInf : 0.0f).store(acc.m + g * W);
      V::zero().store(acc.den + g * W);
    }
    for (int64_t t = 0; t < G * dout * W; t += W) V::zero().store(acc.zt + t);

    for (int64_t r0 = lo; r0 < hi; r0 += RB) {
      Block blk(rows, r0, hi, s, kern.form == growmem::kNegSqdist);
      const int64_t nb = blk.nb;
      const float *kb = blk.k, *vb = blk.v;
      if (stabilised)
        for (int64_t i = 0; i < nb; ++i) {
          const float cw = rows.c ? rows.c[r0 + i] * rows.w[r0 + i] : rows.w[r0 + i];
          const float a = cw < 0 ? -cw : cw;
          s.logcw[i] = __builtin_logf(a > kTiny ? a : kTiny);
        }
      for (int64_t g = 0; g < G; ++g) {
        float* S = s.S;
        dot_rows(kb, din, nb, q.qt + g * din * W, din, S, blk.pk);
        finish_scores(kern, call.alpha, q.q2 + g * W, s.k2, nb, S);
        if (call.kept) {
          const int n = lanes_of(q, g);
          for (int64_t i = 0; i < nb; ++i) {
            float* dst = call.kept + (r0 + i) * q.b + g * W;
            if (n == W) V::load(S + i * W).store(dst); else V::load(S + i * W).store_n(dst, n);
          }
        }
        float* zt = acc.zt + g * dout * W;
        V m = V::load(acc.m + g * W);
        if (stabilised) {   // m = max(m, max_i s_i + log|c_i w_i|); rescale what came before
          V t = V::set1(kNegInf);
          for (int64_t i = 0; i < nb; ++i) t = V::max(t, V::load(S + i * W) + V::set1(s.logcw[i]));
          const V m_new = V::max(m, t);
          if (V::any_gt(m_new, m)) {
            const V r = V::exp(m - m_new);   // 0 where m was -inf
            for (int64_t j = 0; j < dout; ++j) (V::load(zt + j * W) * r).store(zt + j * W);
            (V::load(acc.den + g * W) * r).store(acc.den + g * W);
            m = m_new;
            m.store(acc.m + g * W);
          }
        }
        // e_i = c_i κ(s_i − m), in place
        V den = V::load(acc.den + g * W);
        for (int64_t i = 0; i < nb; ++i) {
          V e = V::load(S + i * W);
          if (kern.exponential) e = V::exp(e - m);
          if (rows.c) e = e * V::set1(rows.c[r0 + i]);
          e.store(S + i * W);
          if (kern.normalised) den = V::fma(e, V::set1(rows.w[r0 + i]), den);
        }
        den.store(acc.den + g * W);
        acc_cols(vb, dout, nb, dout, S, zt, blk.pv);
      }
    }
  }

  // ------------------------------------------------------------------ backward
  static void bwd_part(const growmem::BwdCall& call, int64_t lo, int64_t hi, const growmem::BwdAcc& acc,
                       float* scratch) {
    const growmem::KernelSpec& kern = call.kern;
    const growmem::Rows& rows = call.rows;
    const growmem::Queries& q = call.q;
    const int64_t din = rows.d_in, dout = rows.d_out, G = q.groups;
    const bool row_grads = call.kbar != nullptr;
    const bool neg = kern.form == growmem::kNegSqdist;
    Scratch s(scratch, din, dout, G);
    for (int64_t t = 0; t < G * din * W; t += W) V::zero().store(acc.qt + t);
    for (int64_t g = 0; g < G; ++g) V::zero().store(acc.rowsum + g * W);
    V ssum = V::zero();

    for (int64_t r0 = lo; r0 < hi; r0 += RB) {
      Block blk(rows, r0, hi, s, neg && !call.kept);
      const int64_t nb = blk.nb;
      const float *kb = blk.k, *vb = blk.v;
      for (int64_t g = 0; g < G; ++g) {
        const int n = lanes_of(q, g);
        float* S = s.S;
        if (call.kept) {
          for (int64_t i = 0; i < nb; ++i) {
            const float* src = call.kept + (r0 + i) * q.b + g * W;
            (n == W ? V::load(src) : V::load_n(src, n)).store(S + i * W);
          }
        } else {
          dot_rows(kb, din, nb, q.qt + g * din * W, din, S, blk.pk);
          finish_scores(kern, call.alpha, q.q2 + g * W, s.k2, nb, S);
        }
        float* E = s.E + g * RB * W;   // e = c κ(s − m)
        float* SB = s.SB + g * RB * W; // ∂L/∂s
        // ē_i = ⟨v_i, ∂num⟩ (+ ∂den · w_i)
        dot_rows(vb, dout, nb, call.nbt + g * dout * W, dout, SB, blk.pv);
        const V m = V::load(call.m + g * W);
        const V dbar = V::load(call.dbar + g * W);
        V rowsum = V::load(acc.rowsum + g * W);
        for (int64_t i = 0; i < nb; ++i) {
          const V sc = V::load(S + i * W);
          V e = kern.exponential ? V::exp(sc - m) : sc;
          V eb = V::load(SB + i * W);
          if (kern.normalised) eb = V::fma(dbar, V::set1(rows.w[r0 + i]), eb);
          V sb;
          if (rows.c) {
            const V c = V::set1(rows.c[r0 + i]);
            e = e * c;
            sb = kern.exponential ? eb * e : eb * c;
          } else {
            sb = kern.exponential ? eb * e : eb;
          }
          sb = V::keep(sb, n);
          V::keep(e, n).store(E + i * W);
          sb.store(SB + i * W);
          ssum = V::fma(sb, V::keep(sc, n), ssum);
          rowsum = rowsum + sb;
        }
        rowsum.store(acc.rowsum + g * W);
        acc_cols(kb, din, nb, din, SB, acc.qt + g * din * W, blk.pk);
      }
      if (!row_grads) continue;
      // ∂k_i = α Σ s̄ q  |  2α(Σ s̄ q − k_i Σ s̄);  ∂v_i = Σ e ∂num;  ∂w_i = Σ e ∂den
      if (neg) {
        for (int64_t i = 0; i < nb; ++i) {
          V t = V::zero();
          for (int64_t g = 0; g < G; ++g) t = t + V::load(s.SB + (g * RB + i) * W);
          s.rs[i] = -2.0f * call.alpha * V::sum(t);
        }
      }
      lanes_rows(s.SB, G, q.qp, q.d_in_pad, din, neg ? 2.0f * call.alpha : call.alpha, neg ? kb : nullptr, din,
                 s.rs, nb, call.kbar + r0 * din);
      lanes_rows(s.E, G, call.nbp, call.d_out_pad, dout, 1.0f, nullptr, 0, nullptr, nb, call.vbar + r0 * dout);
      if (call.wbar) {
        for (int64_t i = 0; i < nb; ++i) {
          V t = V::zero();
          for (int64_t g = 0; g < G; ++g) t = V::fma(V::load(s.E + (g * RB + i) * W), V::load(call.dbar + g * W), t);
          call.wbar[r0 + i] = V::sum(t);
        }
      }
    }
    *acc.ssum = double(V::sum(ssum));
  }
};
