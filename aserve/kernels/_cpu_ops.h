/* The small ops of a CPU forward pass, one call each instead of torch's 5-10 eager ops, for
 * _ggufmm.c (included there once).
 *
 * Why: at one decode row the default model's step on 2 cores spent ~7 ms of ~28 in torch's
 * small ops (109 RMSNorms of ~9 ops each, rotary, residual adds) and ~2.7 ms in the reference
 * attention's gathers and padded SDPA call: a few microseconds of dispatch per op, not
 * arithmetic (docs/benchmarks.md, issue 20). Each function here is a plain loop over float32
 * rows. The arithmetic is the eager modules', in float32, in the same order per element;
 * sums (a norm's mean square, a dot product, a softmax's denominator) are taken in a
 * different order, so results agree to float32 rounding, not bit for bit.
 *
 * target_clones: GCC compiles each function for AVX-512, AVX2 and the baseline, and the
 * loader picks one for the CPU (an ifunc), so no dispatch table is needed here. */

#define OPS_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

typedef float ops_v16 __attribute__((vector_size(64))); /* 16 floats: one AVX-512 register */

/* sum of x[i] * y[i]; n any length (the head and hidden sizes are multiples of 16) */
static inline __attribute__((always_inline)) float ops_dot(const float *x, const float *y, int64_t n) {
    ops_v16 a0 = {0}, a1 = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        ops_v16 x0, x1, y0, y1;
        memcpy(&x0, x + i, 64);
        memcpy(&x1, x + i + 16, 64);
        memcpy(&y0, y + i, 64);
        memcpy(&y1, y + i + 16, 64);
        a0 += x0 * y0;
        a1 += x1 * y1;
    }
    a0 += a1;
    float s = 0.0f;
    for (int l = 0; l < 16; l++) s += a0[l];
    for (; i < n; i++) s += x[i] * y[i];
    return s;
}

/* y = x / rms(x) * (gemma ? 1 + w : w) for one row; y may be x. Eager order: x * rsqrt(mean
 * + eps), then times the weight (Gemma's 1 + w in float32). */
static inline __attribute__((always_inline)) void ops_norm_row(const float *x, const float *w, float *y,
                                                               int64_t dim, float eps, int gemma) {
    const float rs = 1.0f / sqrtf(ops_dot(x, x, dim) / (float)dim + eps);
    if (gemma)
        for (int64_t i = 0; i < dim; i++) y[i] = (x[i] * rs) * (1.0f + w[i]);
    else
        for (int64_t i = 0; i < dim; i++) y[i] = w[i] * (x[i] * rs);
}

OPS_CLONES static void ops_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps,
                                   int gemma) {
    for (int64_t r = 0; r < rows; r++) ops_norm_row(x + r * dim, w, y + r * dim, dim, eps, gemma);
}

/* h = residual + (xw ? norm_xw(x) : x); y = norm_w(h). Row by row, h before y. */
OPS_CLONES static void ops_add_rmsnorm(const float *x, const float *res, const float *w, const float *xw, float *h,
                                       float *y, int64_t rows, int64_t dim, float eps, float xeps, int gemma) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim, *rr = res + r * dim;
        float *hr = h + r * dim;
        if (xw != NULL) {
            ops_norm_row(xr, xw, hr, dim, xeps, gemma);
            for (int64_t i = 0; i < dim; i++) hr[i] = rr[i] + hr[i];
        } else {
            for (int64_t i = 0; i < dim; i++) hr[i] = rr[i] + xr[i];
        }
        ops_norm_row(hr, w, y + r * dim, dim, eps, gemma);
    }
}

/* The new tokens' K and V rows (row floats each) into their cache slots loc[i]. */
static inline void ops_store_kv(const float *k, const float *v, float *kc, float *vc, const int64_t *loc, int64_t t,
                                int64_t row) {
    for (int64_t i = 0; i < t; i++) {
        memcpy(kc + loc[i] * row, k + i * row, (size_t)row * sizeof(float));
        memcpy(vc + loc[i] * row, v + i * row, (size_t)row * sizeof(float));
    }
}

/* NeoX rotary: x, y [T, heads, D] contiguous (y may be x), cos/sin [T, D];
 * y = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x[D/2:], x[:D/2]]. */
OPS_CLONES static void ops_rotary(const float *x, float *y, const float *cs, const float *sn, int64_t t,
                                  int64_t heads, int64_t d) {
    const int64_t half = d / 2;
    for (int64_t i = 0; i < t; i++)
        for (int64_t hh = 0; hh < heads; hh++) {
            const float *v = x + (i * heads + hh) * d;
            float *o = y + (i * heads + hh) * d;
            const float *c = cs + i * d, *s = sn + i * d;
            for (int64_t l = 0; l < half; l++) {
                const float a = v[l], b = v[l + half];
                o[l] = a * c[l] + (-b) * s[l];
                o[l + half] = b * c[l + half] + a * s[l + half];
            }
        }
}

/* e^x for 16 floats: x = n ln2 + r (|r| <= ln2 / 2, n rounded to nearest), e^r from Cephes'
 * expf polynomial, 2^n put in the exponent. Relative error ~1e-7; x clamped to [-87, 88], where
 * the result stays a normal float (e^-87 ~ 1.6e-38) or finite. */
typedef int32_t ops_i16 __attribute__((vector_size(64)));
static inline __attribute__((always_inline)) ops_v16 ops_select(ops_i16 m, ops_v16 a, ops_v16 b) {
    return (ops_v16)((m & (ops_i16)a) | (~m & (ops_i16)b)); /* a where m, else b */
}
static inline __attribute__((always_inline)) ops_v16 ops_exp(ops_v16 x) {
    const ops_v16 lo = (ops_v16){0} - 87.0f, hi = (ops_v16){0} + 88.0f;
    x = ops_select(x < lo, lo, ops_select(x > hi, hi, x));
    const ops_v16 magic = (ops_v16){0} + 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const ops_v16 n = (x * 1.44269504088896341f + magic) - magic;
    const ops_v16 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    ops_v16 p = (ops_v16){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const ops_i16 e = (__builtin_convertvector(n, ops_i16) + 127) << 23;
    return p * (ops_v16)e;
}

/* The sampler's uniforms (aserve/sampling/noise.py): for row r < b and token i < n,
 * u[r * n + i] = ((mix32(h[r * hs + i] ^ k[r]) >> 9) + 0.5) / 2^23, with h the tokens' hashes
 * (one row shared, hs = 0, or a row each, hs = n) and k the rows' keys (32-bit values in
 * int64). Integer arithmetic and an exact float conversion: the same bits as the torch ops. */
static inline uint32_t ops_mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x21F0AAADu;
    return x ^ (x >> 16);
}

OPS_CLONES static void ops_race_uniforms(const int64_t *h, int64_t n, int64_t hs, const int64_t *k, int64_t b,
                                         float *u) {
    for (int64_t r = 0; r < b; r++) {
        const uint32_t key = (uint32_t)k[r];
        const int64_t *hr = h + r * hs;
        float *o = u + r * n;
        for (int64_t i = 0; i < n; i++)
            o[i] = ((float)(ops_mix32((uint32_t)hr[i] ^ key) >> 9) + 0.5f) * (1.0f / 8388608.0f);
    }
}

/* Structured outputs' masks (aserve/sampling/sampler.py apply_masks_): for i < r, row
 * rows[i] of logits (row stride `stride` floats) gets -inf at every token t < vocab whose bit
 * (t % 32 of word t / 32) is clear in bits[i * words ...]. Words all set are skipped, words
 * all clear filled: no [r, vocab] temporaries, as the torch ops need. */
OPS_CLONES static void ops_apply_bitmask(float *logits, int64_t stride, const int64_t *rows, int64_t r,
                                         const int32_t *bits, int64_t words, int64_t vocab) {
    const float ninf = -__builtin_inff();
    for (int64_t i = 0; i < r; i++) {
        float *l = logits + rows[i] * stride;
        const uint32_t *b = (const uint32_t *)bits + i * words;
        for (int64_t w = 0; w < words && w * 32 < vocab; w++) {
            const uint32_t word = b[w];
            if (word == 0xFFFFFFFFu) continue;
            const int64_t base = w * 32, n = vocab - base < 32 ? vocab - base : 32;
            for (int64_t j = 0; j < n; j++)
                if (!((word >> j) & 1u)) l[base + j] = ninf;
        }
    }
}

/* y = act(g) * u over n floats (n a multiple of 16): act 1 GELU with the tanh approximation,
 * 0.5 g (1 + tanh z) with z = sqrt(2 / pi) (g + 0.044715 g^3), taken as g / (1 + e^-2z) (the
 * same function, without 1 + tanh's cancellation where tanh z is near -1), else SiLU
 * (g / (1 + e^-g)). Agrees with torch's to float32 rounding. */
OPS_CLONES static void ops_gated(const float *g, const float *u, float *y, int64_t n, int act) {
    for (int64_t i = 0; i < n; i += 16) {
        ops_v16 gv, uv, a;
        memcpy(&gv, g + i, 64);
        memcpy(&uv, u + i, 64);
        if (act == 1) {
            const ops_v16 z = 0.7978845608028654f * (gv + 0.044715f * gv * gv * gv);
            a = gv / (1.0f + ops_exp(-2.0f * z));
        } else {
            a = gv / (1.0f + ops_exp(-gv));
        }
        const ops_v16 out = a * uv;
        memcpy(y + i, &out, 64);
    }
}

/* Attention of each new token over its sequence's cached keys (its own K/V already written).
 * Token i of sequence b sits at position pos[i] and sees keys lo .. pos[i] of that sequence
 * (slots table[row_b, j]); lo = pos[i] - window + 1 with a sliding window, else 0. Scores in
 * float32, optional soft-cap, softmax with the row maximum taken off. Query head hh reads KV
 * head hh / (heads / kv_heads). */
struct attn_args {
    const float *q; /* [T, heads, d] */
    const float *kc, *vc; /* [slots, kv_heads, d] */
    const int64_t *table; /* [rows, table_stride] slot of each position */
    int64_t table_stride;
    const int64_t *seq_row, *pos; /* [T]: each token's table row and position */
    int64_t heads, kv_heads, d, window;
    float scale, softcap;
    float *out; /* [T, heads, d] */
    float *scores; /* token i's scores at scores + i * scores_stride (heads / kv_heads runs of keys) */
    int64_t scores_stride;
};

OPS_CLONES static void ops_attend_token(const struct attn_args *a, int64_t i, float *p) {
    const int64_t group = a->heads / a->kv_heads, d = a->d;
    const int64_t last = a->pos[i];
    const int64_t lo = a->window > 0 && last - a->window + 1 > 0 ? last - a->window + 1 : 0;
    const int64_t nk = last - lo + 1;
    const int64_t *slots = a->table + a->seq_row[i] * a->table_stride + lo;
    for (int64_t g = 0; g < a->kv_heads; g++) {
        /* scores p[hq * nk + j] for this KV head's query heads */
        for (int64_t j = 0; j < nk; j++) {
            const float *k = a->kc + (slots[j] * a->kv_heads + g) * d;
            for (int64_t hq = 0; hq < group; hq++) {
                float s = ops_dot(a->q + (i * a->heads + g * group + hq) * d, k, d) * a->scale;
                if (a->softcap > 0.0f) s = tanhf(s / a->softcap) * a->softcap;
                p[hq * nk + j] = s;
            }
        }
        for (int64_t hq = 0; hq < group; hq++) {
            float *ph = p + hq * nk, mx = ph[0], sum = 0.0f;
            for (int64_t j = 1; j < nk; j++) mx = ph[j] > mx ? ph[j] : mx;
            for (int64_t j = 0; j < nk; j++) {
                ph[j] = expf(ph[j] - mx);
                sum += ph[j];
            }
            const float inv = 1.0f / sum;
            for (int64_t j = 0; j < nk; j++) ph[j] *= inv;
            float *o = a->out + (i * a->heads + g * group + hq) * d;
            memset(o, 0, (size_t)d * sizeof(float));
        }
        for (int64_t j = 0; j < nk; j++) {
            const float *v = a->vc + (slots[j] * a->kv_heads + g) * d;
            for (int64_t hq = 0; hq < group; hq++) {
                const float w = p[hq * nk + j];
                float *o = a->out + (i * a->heads + g * group + hq) * d;
                for (int64_t l = 0; l < d; l++) o[l] += w * v[l];
            }
        }
    }
}
