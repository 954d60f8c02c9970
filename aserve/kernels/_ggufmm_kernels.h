/* The hot loops of _ggufmm.c, included once per instruction set with K(name) giving each
 * copy its own names (name_avx512, name_avx2, name_base); see the dispatch there. */


/* IEEE half -> float, exact for every finite value: the half's exponent and mantissa moved
 * into a float's place and scaled by 2^112 (re-biasing 15 -> 127; subnormals come out right
 * too), the sign put back; infinities and NaNs (never in weights) take the slow branch. */
static inline __attribute__((always_inline)) float K(half_to_float)(uint16_t h) {
    uint32_t bits = (uint32_t)(h & 0x7fff) << 13;
    float f;
    memcpy(&f, &bits, 4);
    f *= 0x1p112f;
    if (__builtin_expect((h & 0x7c00) == 0x7c00, 0)) {
        bits = 0x7f800000u | ((uint32_t)(h & 0x3ff) << 13);
        memcpy(&f, &bits, 4);
    }
    return (h & 0x8000) ? -f : f;
}

static inline __attribute__((always_inline)) uint16_t K(rd16)(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline __attribute__((always_inline)) float K(rdf)(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef uint64_t u64x2 __attribute__((vector_size(16)));

/* ---- one row of blocks -> k floats ---------------------------------------------------- */

/* Q8_0: 32 weights = f16 d, int8 q[32]; w = d * q */
static void K(deq_q8_0)(const uint8_t *src, int64_t k, float *out) {
    for (int64_t b = 0; b < k / 32; b++, src += 34, out += 32) {
        const float d = K(half_to_float)(K(rd16)(src));
        const int8_t *q = (const int8_t *)(src + 2);
        for (int i = 0; i < 32; i++) out[i] = d * (float)q[i];
    }
}

#if defined(__AVX512BW__) && defined(__AVX512VL__)
/* Q5_0, AVX-512BW: a block's 32 quants (q - 16) as two registers of floats, weights 0-15 and
 * 16-31; the 32 high bits are a byte mask. */
static inline __attribute__((always_inline)) __m512 K(q5_0_floats)(const uint8_t *src, __m512 *q1) {
    uint32_t bits;
    memcpy(&bits, src + 2, 4);
    const __m128i v = _mm_loadu_si128((const __m128i *)(src + 6));
    const __m128i m4 = _mm_set1_epi8(0x0f), off = _mm_set1_epi8(16);
    const __m128i lo = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(v, m4), _mm_maskz_mov_epi8((__mmask16)bits, off)), off);
    const __m128i hi = _mm_sub_epi8(
        _mm_or_si128(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_maskz_mov_epi8((__mmask16)(bits >> 16), off)), off);
    *q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo));
}
#endif

/* Q5_0: 32 weights = f16 d, 32 high bits qh, 16 bytes of low nibbles;
 * w[j] = d * ((lo_j | hi_j << 4) - 16), low nibbles for j < 16, high ones for j >= 16.
 * The high bits become bytes through a table (8 per lookup), then 16-byte vector ops and
 * one convert loop. */
static void K(deq_q5_0)(const uint8_t *src, int64_t k, float *out) {
    for (int64_t b = 0; b < k / 32; b++, src += 22, out += 32) {
        const float d = K(half_to_float)(K(rd16)(src));
#if defined(__AVX512BW__) && defined(__AVX512VL__)
        __m512 q1;
        const __m512 q0 = K(q5_0_floats)(src, &q1), dv = _mm512_set1_ps(d);
        _mm512_storeu_ps(out, _mm512_mul_ps(dv, q0));
        _mm512_storeu_ps(out + 16, _mm512_mul_ps(dv, q1));
#else
        /* built in registers: bytes stored 8 at a time and reloaded 16 at a time would stall */
        const uint8_t *qh = src + 2, *qs = src + 6;
        const u64x2 t0 = {q5_high_bits[qh[0]], q5_high_bits[qh[1]]}, t1 = {q5_high_bits[qh[2]], q5_high_bits[qh[3]]};
        const u8x16 h0 = (u8x16)t0, h1 = (u8x16)t1;
        u8x16 v;
        memcpy(&v, qs, 16);
        const u8x16 lo = ((v & 0x0f) | h0) - 16, hi = ((v >> 4) | h1) - 16; /* wraps to int8 */
        int8_t q[32];
        memcpy(q, &lo, 16);
        memcpy(q + 16, &hi, 16);
        for (int j = 0; j < 32; j++) out[j] = d * (float)q[j];
#endif
    }
}

/* Q4_K's 6-bit scale and min of group j (0-7) from its 12 packed bytes s (ggml's get_scale_min_k4). */
static inline __attribute__((always_inline)) void K(q4_k_scale_min)(const uint8_t *s, int j, int *a, int *m) {
    if (j < 4) {
        *a = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *a = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K: 256 weights = f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) pairs for 8 groups of
 * 32, 128 bytes of nibbles; w = d * sc * q - dmin * m. No fused multiply-add here, so the
 * weights equal gguf-py's (two roundings) bit for bit. */
__attribute__((optimize("fp-contract=off"))) static void K(deq_q4_k)(const uint8_t *src, int64_t k, float *out) {
    for (int64_t b = 0; b < k / 256; b++, src += 144) {
        const float d = K(half_to_float)(K(rd16)(src));
        const float dmin = K(half_to_float)(K(rd16)(src + 2));
        const uint8_t *s = src + 4;
        const uint8_t *q = src + 16;
        for (int g = 0; g < 8; g += 2, q += 32) {
            float sc[2], mn[2];
            for (int h = 0; h < 2; h++) {
                int a, m;
                K(q4_k_scale_min)(s, g + h, &a, &m);
                sc[h] = d * (float)a;
                mn[h] = dmin * (float)m;
            }
            for (int l = 0; l < 32; l++) {
                float w0 = sc[0] * (float)(q[l] & 0x0f);
                float w1 = sc[1] * (float)(q[l] >> 4);
                out[l] = w0 - mn[0];
                out[l + 32] = w1 - mn[1];
            }
            out += 64;
        }
    }
}

#if defined(__AVX512BW__) && defined(__AVX512VL__)
/* Q6_K, AVX-512: quants 32 j .. 32 j + 31 of a half (j < 4) as int8 (q - 32), from its 64 bytes
 * of low nibbles ql and its 32 bytes of high bits h (loaded). */
static inline __attribute__((always_inline)) __m256i K(q6_k_run_pair)(const uint8_t *ql, __m256i h, int j) {
    const __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 32 * (j & 1)));
    const __m256i nib = _mm256_and_si256(_mm256_srli_epi16(l, 4 * (j >> 1)), _mm256_set1_epi8(0x0f));
    const __m256i hb = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * j), _mm256_set1_epi8(3)), 4);
    return _mm256_sub_epi8(_mm256_or_si256(nib, hb), _mm256_set1_epi8(32));
}
#endif

/* Q6_K: 256 weights = 128 bytes low nibbles, 64 bytes of 2-bit highs, int8 scales[16] (one
 * per 16 weights), f16 d; w = d * scale * (q - 32). Weight 32 * j + l of a half (j < 4,
 * l < 32) takes nibble j / 2 of ql[l + 32 * (j % 2)] and bits 2j of qh[l]; each run of 16
 * shares one scale, so the inner loop is a straight vector loop. */
static void K(deq_q6_k)(const uint8_t *src, int64_t k, float *out) {
    for (int64_t b = 0; b < k / 256; b++, src += 210) {
        const uint8_t *ql = src;
        const uint8_t *qh = src + 128;
        const int8_t *sc = (const int8_t *)(src + 192);
        const float d = K(half_to_float)(K(rd16)(src + 208));
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, out += 128) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
            const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            for (int j = 0; j < 4; j++) {
                const __m256i q = K(q6_k_run_pair)(ql, h, j);
                const __m512 s0 = _mm512_set1_ps(d * (float)sc[2 * j]), s1 = _mm512_set1_ps(d * (float)sc[2 * j + 1]);
                _mm512_storeu_ps(out + 32 * j, _mm512_mul_ps(s0, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)))));
                _mm512_storeu_ps(out + 32 * j + 16,
                                 _mm512_mul_ps(s1, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)))));
            }
#else
            for (int j = 0; j < 4; j++) {
                for (int g = 0; g < 2; g++) {
                    u8x16 lo, hi;
                    memcpy(&lo, ql + 32 * (j & 1) + 16 * g, 16);
                    memcpy(&hi, qh + 16 * g, 16);
                    const u8x16 v = (((lo >> (4 * (j >> 1))) & 0x0f) | (((hi >> (2 * j)) & 3) << 4)) - 32;
                    int8_t q[16];
                    memcpy(q, &v, 16);
                    const float s = d * (float)sc[2 * j + g];
                    float *o = out + 32 * j + 16 * g;
                    for (int l = 0; l < 16; l++) o[l] = s * (float)q[l];
                }
            }
#endif
        }
    }
}

/* ---- the repacked layouts (_ggufmm.c, "Repacked layouts") -> floats ------------------- */

/* Q5_0R: 32 weights = float d, int8 q[32]; w = d * q (Q5_0's d * (q5 - 16), the same bits) */
static void K(deq_q5_0r)(const uint8_t *src, int64_t k, float *out) {
    for (int64_t b = 0; b < k / 32; b++, src += 36, out += 32) {
        const float d = K(rdf)(src);
        const int8_t *q = (const int8_t *)(src + 4);
        for (int i = 0; i < 32; i++) out[i] = d * (float)q[i];
    }
}

/* Q4_KR: 256 weights = float scale[8], float min[8], Q4_K's 128 bytes of nibbles;
 * w = scale_g * q - min_g, two roundings as deq_q4_k. */
__attribute__((optimize("fp-contract=off"))) static void K(deq_q4_kr)(const uint8_t *src, int64_t k, float *out) {
    for (int64_t b = 0; b < k / 256; b++, src += 192) {
        const uint8_t *q = src + 64;
        for (int g = 0; g < 8; g += 2, q += 32, out += 64) {
            const float s0 = K(rdf)(src + 4 * g), s1 = K(rdf)(src + 4 * g + 4);
            const float n0 = K(rdf)(src + 32 + 4 * g), n1 = K(rdf)(src + 36 + 4 * g);
            for (int l = 0; l < 32; l++) {
                float w0 = s0 * (float)(q[l] & 0x0f);
                float w1 = s1 * (float)(q[l] >> 4);
                out[l] = w0 - n0;
                out[l + 32] = w1 - n1;
            }
        }
    }
}

/* Q6_KR: 256 weights = float scale[16] (one per 16 weights), int8 q[256]; w = scale * q */
static void K(deq_q6_kr)(const uint8_t *src, int64_t k, float *out) {
    for (int64_t b = 0; b < k / 256; b++, src += 320) {
        const int8_t *q = (const int8_t *)(src + 64);
        for (int r = 0; r < 16; r++, q += 16, out += 16) {
            const float s = K(rdf)(src + 4 * r);
            for (int l = 0; l < 16; l++) out[l] = s * (float)q[l];
        }
    }
}

/* ---- dot products of one dequantized row with up to four rows of x --------------------- */

/* VW floats per vector: 16 (AVX-512), 8 (AVX2), 4 (baseline SSE2), set by the includer. */
typedef float K(vf) __attribute__((vector_size(VW * 4)));

static inline __attribute__((always_inline)) K(vf) K(ld)(const float *p) {
    K(vf) v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) float K(hsum)(K(vf) v) {
    float s = 0.0f;
    for (int i = 0; i < VW; i++) s += v[i];
    return s;
}

/* w: one row [k] (k a multiple of 32); y[r * ldy] = dot(w, x_r) for the m rows of x. */
static void K(dot_one)(const float *w, int64_t k, const float *x, int64_t m, float *y, int64_t ldy) {
    for (int64_t r = 0; r < m; r++) {
        const float *xr = x + r * k;
        K(vf) a0 = {0}, a1 = {0};
        for (int64_t i = 0; i < k; i += 2 * VW) {
            a0 += K(ld)(w + i) * K(ld)(xr + i);
            a1 += K(ld)(w + i + VW) * K(ld)(xr + i + VW);
        }
        y[r * ldy] = K(hsum)(a0 + a1);
    }
}

/* w: four rows [4, k]; y[r * ldy + j] = dot(w_j, x_r). A register tile of 4 weight rows by
 * XT rows of x (4 x 4 accumulators with 32 vector registers, 4 x 2 with 16): each vector of
 * w or x loaded from L1 feeds XT or 4 FMAs, and x is read once per four weight rows. */
#define XT (VW == 16 ? 4 : 2)
static void K(dot_rows)(const float *w, int64_t nw, int64_t k, const float *x, int64_t m, float *y, int64_t ldy) {
    if (nw != 4) {
        for (int64_t j = 0; j < nw; j++) K(dot_one)(w + j * k, k, x, m, y + j, ldy);
        return;
    }
    int64_t r = 0;
    for (; r + XT <= m; r += XT) {
        K(vf) acc[4][XT];
        for (int j = 0; j < 4; j++)
            for (int t = 0; t < XT; t++) acc[j][t] = (K(vf)){0};
        for (int64_t i = 0; i < k; i += VW) {
            K(vf) wv[4], xv[XT];
            for (int j = 0; j < 4; j++) wv[j] = K(ld)(w + j * k + i);
            for (int t = 0; t < XT; t++) xv[t] = K(ld)(x + (r + t) * k + i);
            for (int j = 0; j < 4; j++)
                for (int t = 0; t < XT; t++) acc[j][t] += wv[j] * xv[t];
        }
        for (int t = 0; t < XT; t++)
            for (int j = 0; j < 4; j++) y[(r + t) * ldy + j] = K(hsum)(acc[j][t]);
    }
    for (int j = 0; j < 4; j++) K(dot_one)(w + j * k, k, x + r * k, m - r, y + r * ldy + j, ldy);
}
#undef XT

/* The body of a gemv_* entry: each of nw weight rows against m rows of x, through a row
 * function inlined with a constant M (so its accumulators stay in registers). */
#define GEMV_ROWS_LOOP(ROW, NBLOCKS)                                                                  \
    for (int64_t j = 0; j < nw; j++, w += row_bytes) {                                                \
        switch (m) {                                                                                  \
        case 1: ROW(w, NBLOCKS, x, k, 1, y + j, ldy); break;                                          \
        case 2: ROW(w, NBLOCKS, x, k, 2, y + j, ldy); break;                                          \
        case 3: ROW(w, NBLOCKS, x, k, 3, y + j, ldy); break;                                          \
        case 4: ROW(w, NBLOCKS, x, k, 4, y + j, ldy); break;                                          \
        case 5: ROW(w, NBLOCKS, x, k, 5, y + j, ldy); break;                                          \
        default: ROW(w, NBLOCKS, x, k, 6, y + j, ldy); break;                                         \
        }                                                                                             \
    }

/* ---- Q5_0, Q4_K and Q6_K rows times a few rows of x, fused (AVX-512 copy only) -------
 *
 * A decode step multiplies each weight row by one row of x: dequantizing four rows into L1
 * and reading them back (above) costs a store and a load per 16 weights and a multiply by
 * the block scale per weight. Here a block's 32 quants become two registers of floats that
 * meet x at once, and the scale multiplies the block's partial sum instead:
 * y = sum_b d_b * (q_b . x_b). Same products, rounded in another order (to float32). */
#if defined(__AVX512BW__) && defined(__AVX512VL__)
/* The fused rows read the repacked layouts (below, "Repacked layouts"): a block's quants are
 * already int8 (q - offset) in weight order and its scales already float, so a block costs two
 * widening loads and two converts before it meets x, where the GGUF layout also wants its bits
 * unpacked and its half-precision scales converted. The products and their order are the
 * GGUF-layout kernels' own, so the results are the same bits. */

/* One weight row against M rows of x (M a constant after inlining): two accumulators per
 * row of x, even and odd blocks, so consecutive blocks' scaled adds do not wait on each other. */
static inline __attribute__((always_inline)) void K(q5_0r_gemv_row)(const uint8_t *src, int64_t nb, const float *x,
                                                                    int64_t k, const int M, float *y, int64_t ldy) {
    __m512 acc[GEMV_MAX_ROWS][2];
    for (int r = 0; r < M; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, src += 36) {
        const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + 4))));
        const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + 20))));
        const __m512 dv = _mm512_set1_ps(K(rdf)(src));
        for (int r = 0; r < M; r++) {
            const float *xr = x + r * k + 32 * b;
            const __m512 t = _mm512_fmadd_ps(q1, _mm512_loadu_ps(xr + 16), _mm512_mul_ps(q0, _mm512_loadu_ps(xr)));
            acc[r][b & 1] = _mm512_fmadd_ps(dv, t, acc[r][b & 1]);
        }
    }
    for (int r = 0; r < M; r++) y[r * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

/* nw rows of W (row_bytes apart) times m <= GEMV_MAX_ROWS rows of x: y[r * ldy + j] */
static void K(gemv_q5_0r)(const uint8_t *w, int64_t row_bytes, int64_t nw, int64_t k, const float *x, int64_t m,
                          float *y, int64_t ldy) {
    GEMV_ROWS_LOOP(K(q5_0r_gemv_row), k / 32)
}

/* Q4_K: per group of 32, w = (d * sc) * q - (dmin * m), so q . x takes the scale and the
 * group's plain sum of x takes the min: y = sum_g (d sc_g) (q_g . x_g) - (dmin m_g) sum(x_g). */
static inline __attribute__((always_inline)) void K(q4_kr_gemv_row)(const uint8_t *src, int64_t nsb, const float *x,
                                                                    int64_t k, const int M, float *y, int64_t ldy) {
    __m512 acc[GEMV_MAX_ROWS], accm[GEMV_MAX_ROWS];
    for (int r = 0; r < M; r++) acc[r] = accm[r] = _mm512_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t sb = 0; sb < nsb; sb++, src += 192) {
        const uint8_t *q = src + 64;
        for (int g = 0; g < 8; g += 2, q += 32) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)q);
            const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            const __m512 a0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(lo)));
            const __m512 a1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(lo, 1)));
            const __m512 b0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(hi)));
            const __m512 b1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(hi, 1)));
            const __m512 s0 = _mm512_set1_ps(K(rdf)(src + 4 * g)), s1 = _mm512_set1_ps(K(rdf)(src + 4 * g + 4));
            const __m512 n0 = _mm512_set1_ps(K(rdf)(src + 32 + 4 * g)), n1 = _mm512_set1_ps(K(rdf)(src + 36 + 4 * g));
            const int64_t off = sb * 256 + g * 32;
            for (int r = 0; r < M; r++) {
                const float *xr = x + r * k + off;
                const __m512 x0 = _mm512_loadu_ps(xr), x1 = _mm512_loadu_ps(xr + 16);
                const __m512 x2 = _mm512_loadu_ps(xr + 32), x3 = _mm512_loadu_ps(xr + 48);
                acc[r] = _mm512_fmadd_ps(s0, _mm512_fmadd_ps(a1, x1, _mm512_mul_ps(a0, x0)), acc[r]);
                acc[r] = _mm512_fmadd_ps(s1, _mm512_fmadd_ps(b1, x3, _mm512_mul_ps(b0, x2)), acc[r]);
                accm[r] = _mm512_fmadd_ps(n0, _mm512_add_ps(x0, x1), accm[r]);
                accm[r] = _mm512_fmadd_ps(n1, _mm512_add_ps(x2, x3), accm[r]);
            }
        }
    }
    for (int r = 0; r < M; r++) y[r * ldy] = _mm512_reduce_add_ps(_mm512_sub_ps(acc[r], accm[r]));
}

static void K(gemv_q4_kr)(const uint8_t *w, int64_t row_bytes, int64_t nw, int64_t k, const float *x, int64_t m,
                          float *y, int64_t ldy) {
    GEMV_ROWS_LOOP(K(q4_kr_gemv_row), k / 256)
}

/* Q6_K: per run of 16, w = (d * sc) * q, q = 6 bits - 32. */
static inline __attribute__((always_inline)) void K(q6_kr_gemv_row)(const uint8_t *src, int64_t nsb, const float *x,
                                                                    int64_t k, const int M, float *y, int64_t ldy) {
    __m512 acc[GEMV_MAX_ROWS][2];
    for (int r = 0; r < M; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++, src += 320) {
        for (int c = 0; c < 8; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(src + 64 + 32 * c));
            const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
            const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
            const __m512 s0 = _mm512_set1_ps(K(rdf)(src + 8 * c)), s1 = _mm512_set1_ps(K(rdf)(src + 8 * c + 4));
            const int64_t o = sb * 256 + 32 * c;
            for (int r = 0; r < M; r++) {
                const float *xr = x + r * k + o;
                acc[r][0] = _mm512_fmadd_ps(s0, _mm512_mul_ps(q0, _mm512_loadu_ps(xr)), acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(s1, _mm512_mul_ps(q1, _mm512_loadu_ps(xr + 16)), acc[r][1]);
            }
        }
    }
    for (int r = 0; r < M; r++) y[r * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

static void K(gemv_q6_kr)(const uint8_t *w, int64_t row_bytes, int64_t nw, int64_t k, const float *x, int64_t m,
                          float *y, int64_t ldy) {
    GEMV_ROWS_LOOP(K(q6_kr_gemv_row), k / 256)
}
#endif
