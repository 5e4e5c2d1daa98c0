/* CPU kernels of fusionrag_llm, compiled once per machine with the system C compiler
 * (kernels/cpu_quant.py builds and loads them through ctypes):
 *
 * - fr_quant_linear: rows times a block-quantized weight (GGUF Q8_0 / Q4_1 blocks, float32 rows);
 * - fr_decode_layers: the decoder layers of a decode step (one new token per sequence) of a
 *   Llama-family model whose linear weights are such blocks, in one call: norms, projections, rotary,
 *   the K/V write and attention over each sequence's cache, the MLP (models/fast_decode.py);
 * - fr_quantize: float32 weights into those blocks, as cpu_quant.quantize_ref does, in one pass;
 * - fr_rotate_rows: rotary embedding of float32 rows into a cache's slots, as kernels/rotary.py rotate
 *   computes it, in one pass;
 * - fr_attend_prefix: a prefill's attention (every query over a prefix of the cache's slots: causal
 *   blocks, position-sorted sparse recomputes) in one call, flash-style (kernels/cpu_attention.py).
 *
 * Work is spread over OpenMP threads (the runtime torch already loaded: one thread pool).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

/* the block scales are IEEE half floats, as in GGUF */
#if defined(__F16C__)
#include <immintrin.h>
static inline float half(uint16_t h) { return _cvtsh_ss(h); }
#else
/* half -> float without F16C: normals, subnormals, zeros, infinities and NaN */
static inline float half(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
    if (exponent == 0x1F) {
        bits = sign | 0x7F800000u | (mantissa << 13);
    } else if (exponent) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa) {
        int shift = 0;
        while (!(mantissa & 0x400)) { mantissa <<= 1; shift++; }
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((mantissa & 0x3FF) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
#endif

#if defined(__AVX512F__)
/* AVX-512: 16 lanes take half a block per conversion, a third of the shuffle-port work of AVX2 */
static float dot_q8(const int8_t *w, const uint16_t *dw, const float *x, int64_t blocks) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const int8_t *q = w + b * 32;
        const float *v = x + b * 32;
        __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))),
                                 _mm512_loadu_ps(v));
        s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)))),
                            _mm512_loadu_ps(v + 16), s);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(half(dw[b])), s, acc);
    }
    return _mm512_reduce_add_ps(acc);
}

static float dot_q4(const uint8_t *w, const uint16_t *dw, const uint16_t *mw, const float *x, const float *xs,
                    int64_t blocks) {
    __m512 acc = _mm512_setzero_ps();
    float mins = 0.0f;
    const __m128i low = _mm_set1_epi8(0x0F);
    for (int64_t b = 0; b < blocks; b++) {
        __m128i raw = _mm_loadu_si128((const __m128i *)(w + b * 16));
        const float *v = x + b * 32;
        __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, low))), _mm512_loadu_ps(v));
        s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), low))),
                            _mm512_loadu_ps(v + 16), s);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(half(dw[b])), s, acc);
        mins += half(mw[b]) * xs[b];
    }
    return _mm512_reduce_add_ps(acc) + mins;
}
#else
/* One output: row w of the weight (k / 32 blocks) times the float row x; xs: x's block sums. */
static float dot_q8(const int8_t *w, const uint16_t *dw, const float *x, int64_t blocks) {
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const int8_t *q = w + b * 32;
        const float *v = x + b * 32;
        __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q))),
                                 _mm256_loadu_ps(v));
        for (int i = 8; i < 32; i += 8)
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)))),
                                _mm256_loadu_ps(v + i), s);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(dw[b])), s, acc);
    }
    return hsum(acc);
#else
    float acc = 0.0f;
    for (int64_t b = 0; b < blocks; b++) {
        float s = 0.0f;
        for (int i = 0; i < 32; i++) s += (float)w[b * 32 + i] * x[b * 32 + i];
        acc += half(dw[b]) * s;
    }
    return acc;
#endif
}

static float dot_q4(const uint8_t *w, const uint16_t *dw, const uint16_t *mw, const float *x, const float *xs,
                    int64_t blocks) {
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    const __m128i low = _mm_set1_epi8(0x0F);
    for (int64_t b = 0; b < blocks; b++) {
        __m128i raw = _mm_loadu_si128((const __m128i *)(w + b * 16));
        __m128i lo = _mm_and_si128(raw, low), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
        const float *v = x + b * 32;
        __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), _mm256_loadu_ps(v));
        s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), _mm256_loadu_ps(v + 8), s);
        s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), _mm256_loadu_ps(v + 16), s);
        s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), _mm256_loadu_ps(v + 24), s);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(half(dw[b])), s, acc);
        mins += half(mw[b]) * xs[b];
    }
    return hsum(acc) + mins;
#else
    float acc = 0.0f;
    for (int64_t b = 0; b < blocks; b++) {
        float s = 0.0f;
        for (int i = 0; i < 16; i++)
            s += (float)(w[b * 16 + i] & 0x0F) * x[b * 32 + i] + (float)(w[b * 16 + i] >> 4) * x[b * 32 + 16 + i];
        acc += half(dw[b]) * s + half(mw[b]) * xs[b];
    }
    return acc;
#endif
}

#endif  /* __AVX512F__ */

/* A weight [n, k]: float32 rows (bits 32), or block-quantized: q int8 [n, k] (bits 8) or packed
   nibbles [n, k / 2] (bits 4), d (and for 4 bits m) half floats [n, k / 32]. Tiled (4 bits, AVX-512 builds only): the same bytes
   and scales for tiles of 16 rows, q [n / 16, k / 32, 16, 16] (tile, block, byte i of the block, row)
   and d, m [n / 16, k / 32, 16]: one vector then holds a byte of 16 rows, so a block's scales and
   minimums apply to 16 outputs at once instead of one. */
typedef struct {
    int64_t bits, tiled;
    const void *q;
    const uint16_t *d, *m;
    int64_t n, k;
} fr_qweight;

/* 1 where this build multiplies tiled 4-bit weights (AVX-512), else 0 */
int fr_quant_can_tile(void) {
#if defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}

#if defined(__AVX512F__)
#define FR_ROWS 8  /* rows that share one dequantized block in the multi-row kernels */

/* One row through a tiled 4-bit weight, converting each nibble as it is used (faster for one row than
   keeping the block's floats; the same sums in the same order as qlinear_tiled). */
static void qlinear_tiled_row(const fr_qweight *w, const float *x, float *y, const float *xs) {
    int64_t k = w->k, n = w->n, blocks = k / 32;
    const __m512i low = _mm512_set1_epi32(0x0F);
    #pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n / 16; t++) {
        const uint8_t *q = (const uint8_t *)w->q + t * blocks * 256;
        const uint16_t *d = w->d + t * blocks * 16, *mins = w->m + t * blocks * 16;
        __m512 acc = _mm512_setzero_ps(), base = _mm512_setzero_ps();
        for (int64_t b = 0; b < blocks; b++) {
            const uint8_t *p = q + b * 256;
            const float *v = x + b * 32;
            __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
            for (int i = 0; i < 16; i += 2) {
                __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + i * 16)));
                __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + i * 16 + 16)));
                s0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(a, low)), _mm512_set1_ps(v[i]), s0);
                s1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(a, 4)), _mm512_set1_ps(v[i + 16]), s1);
                s2 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(c, low)), _mm512_set1_ps(v[i + 1]), s2);
                s3 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(c, 4)), _mm512_set1_ps(v[i + 17]), s3);
            }
            __m512 s = _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
            acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + b * 16))), s, acc);
            base = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mins + b * 16))),
                                   _mm512_set1_ps(xs[b]), base);
        }
        _mm512_storeu_ps(y + t * 16, _mm512_add_ps(acc, base));
    }
}

/* y [rows, n] (rows ldy floats apart) = x [rows, k] @ W.T for a tiled 4-bit weight; xs: x's block sums.
   Each block of a tile is turned into floats once and multiplied into up to FR_ROWS rows: the nibble
   conversions, most of the work of one row, are shared by a batch's rows. Every row is summed in the
   same order whatever `rows` is, so a sequence's numbers do not depend on the batch it is in. */
static void qlinear_tiled(const fr_qweight *w, const float *x, int64_t rows, float *y, int64_t ldy, const float *xs) {
    if (rows == 1) {
        qlinear_tiled_row(w, x, y, xs);
        return;
    }
    int64_t k = w->k, n = w->n, blocks = k / 32;
    const __m512i low = _mm512_set1_epi32(0x0F);
    #pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n / 16; t++) {
        const uint8_t *q = (const uint8_t *)w->q + t * blocks * 256;
        const uint16_t *d = w->d + t * blocks * 16, *mins = w->m + t * blocks * 16;
        for (int64_t r0 = 0; r0 < rows; r0 += FR_ROWS) {
            int64_t count = rows - r0 < FR_ROWS ? rows - r0 : FR_ROWS;
            __m512 acc[FR_ROWS], base[FR_ROWS], wv[32];
            for (int64_t r = 0; r < count; r++) acc[r] = base[r] = _mm512_setzero_ps();
            for (int64_t b = 0; b < blocks; b++) {
                const uint8_t *p = q + b * 256;
                for (int i = 0; i < 16; i += 2) {  /* byte i holds element i (low nibble) and i + 16 (high) */
                    __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + i * 16)));
                    __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + i * 16 + 16)));
                    wv[2 * i] = _mm512_cvtepi32_ps(_mm512_and_si512(a, low));
                    wv[2 * i + 1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(a, 4));
                    wv[2 * i + 2] = _mm512_cvtepi32_ps(_mm512_and_si512(c, low));
                    wv[2 * i + 3] = _mm512_cvtepi32_ps(_mm512_srli_epi32(c, 4));
                }
                __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + b * 16)));
                __m512 least = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mins + b * 16)));
                for (int64_t r = 0; r < count; r++) {
                    const float *v = x + (r0 + r) * k + b * 32;
                    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;  /* four chains hide the FMA latency */
                    for (int i = 0; i < 16; i += 2) {
                        s0 = _mm512_fmadd_ps(wv[2 * i], _mm512_set1_ps(v[i]), s0);
                        s1 = _mm512_fmadd_ps(wv[2 * i + 1], _mm512_set1_ps(v[i + 16]), s1);
                        s2 = _mm512_fmadd_ps(wv[2 * i + 2], _mm512_set1_ps(v[i + 1]), s2);
                        s3 = _mm512_fmadd_ps(wv[2 * i + 3], _mm512_set1_ps(v[i + 17]), s3);
                    }
                    __m512 s = _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
                    acc[r] = _mm512_fmadd_ps(scale, s, acc[r]);
                    base[r] = _mm512_fmadd_ps(least, _mm512_set1_ps(xs[(r0 + r) * blocks + b]), base[r]);
                }
            }
            for (int64_t r = 0; r < count; r++) _mm512_storeu_ps(y + (r0 + r) * ldy + t * 16, _mm512_add_ps(acc[r], base[r]));
        }
    }
}

/* y [rows, n] = x [rows, k] @ W.T for an 8-bit weight, several rows at once: each block of an output's
   weight is turned into floats once for up to FR_ROWS rows, each row summed as dot_q8 sums it. */
static void qlinear_q8_rows(const fr_qweight *w, const float *x, int64_t rows, float *y, int64_t ldy) {
    int64_t k = w->k, n = w->n, blocks = k / 32;
    #pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++) {
        const int8_t *q = (const int8_t *)w->q + j * k;
        const uint16_t *dw = w->d + j * blocks;
        for (int64_t r0 = 0; r0 < rows; r0 += FR_ROWS) {
            int64_t count = rows - r0 < FR_ROWS ? rows - r0 : FR_ROWS;
            __m512 acc[FR_ROWS];
            for (int64_t r = 0; r < count; r++) acc[r] = _mm512_setzero_ps();
            for (int64_t b = 0; b < blocks; b++) {
                __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + b * 32))));
                __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + b * 32 + 16))));
                __m512 scale = _mm512_set1_ps(half(dw[b]));
                for (int64_t r = 0; r < count; r++) {
                    const float *v = x + (r0 + r) * k + b * 32;
                    __m512 s = _mm512_fmadd_ps(hi, _mm512_loadu_ps(v + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(v)));
                    acc[r] = _mm512_fmadd_ps(scale, s, acc[r]);
                }
            }
            for (int64_t r = 0; r < count; r++) y[(r0 + r) * ldy + j] = _mm512_reduce_add_ps(acc[r]);
        }
    }
}
#endif

static float dot_f32(const float *w, const float *x, int64_t k) {
    float s = 0.0f;
    #pragma omp simd reduction(+:s)
    for (int64_t i = 0; i < k; i++) s += w[i] * x[i];
    return s;
}

/* y [rows, n] (rows ldy floats apart) = x [rows, k] @ W.T; xs: room for rows * k / 32 floats (x's block sums). */
static void qlinear(const fr_qweight *w, const float *x, int64_t rows, float *y, int64_t ldy, float *xs) {
    int64_t k = w->k, n = w->n, blocks = k / 32;
    if (w->bits == 32) {
        #pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < n; j++)
            for (int64_t r = 0; r < rows; r++) y[r * ldy + j] = dot_f32((const float *)w->q + j * k, x + r * k, k);
        return;
    }
    for (int64_t r = 0; r < rows * blocks; r++) {
        float s = 0.0f;
        for (int i = 0; i < 32; i++) s += x[r * 32 + i];
        xs[r] = s;
    }
#if defined(__AVX512F__)
    if (w->tiled) {
        qlinear_tiled(w, x, rows, y, ldy, xs);
        return;
    }
    if (w->bits == 8 && rows > 1) {
        qlinear_q8_rows(w, x, rows, y, ldy);
        return;
    }
#endif
    #pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++) {
        for (int64_t r = 0; r < rows; r++) {
            y[r * ldy + j] = w->bits == 8
                ? dot_q8((const int8_t *)w->q + j * k, w->d + j * blocks, x + r * k, blocks)
                : dot_q4((const uint8_t *)w->q + j * (k / 2), w->d + j * blocks, w->m + j * blocks, x + r * k,
                         xs + r * blocks, blocks);
        }
    }
}

/* y [m, n] = x [m, k] @ W.T; W is n rows of k / 32 blocks (tiled or not, see fr_qweight); mw (q4
   minimums) is NULL for q8. Returns 0, 1 when memory could not be had, 2 for a tiled weight in a
   build without AVX-512. */
int fr_quant_linear(int bits, int tiled, const float *x, int64_t m, int64_t k, const void *w, const uint16_t *dw,
                    const uint16_t *mw, int64_t n, float *y) {
    if (tiled && !fr_quant_can_tile()) return 2;
    fr_qweight weight = {bits, tiled, w, dw, mw, n, k};
    float *xs = (float *)malloc(sizeof(float) * (size_t)(m * (k / 32) + 1));
    if (!xs) return 1;
    qlinear(&weight, x, m, y, n, xs);
    free(xs);
    return 0;
}

/* ---- decode steps ---------------------------------------------------------------------------- */

/* exp(x) in float32 to about 2 ulp, branch-free so loops over it vectorize: x = n ln2 + r, |r| <= ln2 / 2,
   exp(r) by a degree-6 polynomial, times 2^n built in the exponent bits. Inputs below -87 give ~1e-38.
   The constants are shared with fr_exp16, its 16-lane form. */
#define FR_LOG2E 1.44269504088896341f
#define FR_LN2_HI 0.693359375f  /* ln 2 = FR_LN2_HI - FR_LN2_LO, the first exact in few bits */
#define FR_LN2_LO 2.12194440e-4f
#define FR_EXP_P0 1.9875691500e-4f  /* the polynomial's coefficients, highest degree first */
#define FR_EXP_P1 1.3981999507e-3f
#define FR_EXP_P2 8.3334519073e-3f
#define FR_EXP_P3 4.1665795894e-2f
#define FR_EXP_P4 1.6666665459e-1f
#define FR_EXP_P5 5.0000001201e-1f
static inline float fr_exp(float x) {
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;  /* not fminf/fmaxf: those are calls, not vectorized */
    float n = floorf(x * FR_LOG2E + 0.5f);
    float r = x - n * FR_LN2_HI + n * FR_LN2_LO;
    float p = FR_EXP_P0;
    p = p * r + FR_EXP_P1;
    p = p * r + FR_EXP_P2;
    p = p * r + FR_EXP_P3;
    p = p * r + FR_EXP_P4;
    p = p * r + FR_EXP_P5;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

typedef struct {
    const float *input_norm, *post_norm;  /* [hidden] */
    const float *qkv_bias;                /* [(heads + 2 kv_heads) * head_dim] or NULL */
    const float *q_norm, *k_norm;         /* [head_dim] per-head norms of queries and keys (Qwen3) or NULL */
    /* q, k, v, o, gate, up, down projections; q|k|v in proj[0] when proj[1].q is NULL (one weight of
       their rows), gate|up in proj[4] when proj[5].q is NULL */
    fr_qweight proj[7];
} fr_layer;

typedef struct {
    int64_t layers, hidden, heads, kv_heads, head_dim, intermediate;
    double eps;
    const fr_layer *layer;
} fr_model;

/* out [rows, size] = x / rms(x) * weight, per row */
static void rms_norm(const float *x, const float *weight, int64_t rows, int64_t size, double eps, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *v = x + r * size;
        float s = 0.0f;
        #pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < size; i++) s += v[i] * v[i];
        float inv = 1.0f / sqrtf(s / (float)size + (float)eps);
        #pragma omp simd
        for (int64_t i = 0; i < size; i++) out[r * size + i] = weight[i] * (v[i] * inv);
    }
}

/* x [d] rotated by the half-rotation convention: x * cos + rotate_half(x) * sin */
static void rotate(float *x, const float *cos, const float *sin, int64_t d) {
    float tmp[512];
    int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        tmp[i] = x[i] * cos[i] - x[i + half] * sin[i];
        tmp[i + half] = x[i + half] * cos[i + half] + x[i] * sin[i + half];
    }
    memcpy(x, tmp, sizeof(float) * (size_t)d);
}

/* y [rows, width] = the rows through `count` projections that share an input (q|k|v: 3, gate|up: 2):
   one weight of all their rows (parts[1].q NULL), or one weight each, of `first`, then `size` rows */
static void project(const fr_qweight *parts, int64_t count, const float *x, int64_t rows, float *y, int64_t width,
                    int64_t first, int64_t size, float *xs) {
    if (!parts[1].q) {
        qlinear(&parts[0], x, rows, y, width, xs);
        return;
    }
    for (int64_t i = 0; i < count; i++) qlinear(&parts[i], x, rows, y + (i ? first + (i - 1) * size : 0), width, xs);
}

#define FR_KEYS 512    /* keys per attention task */
#define FR_GROUP 16    /* most query heads per key/value head */

#if defined(__AVX512F__)
/* [sum(a), sum(b), sum(c), sum(e)]: four dot products' partial vectors reduced together */
static inline __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 e) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 ce = _mm512_add_ps(_mm512_unpacklo_ps(c, e), _mm512_unpackhi_ps(c, e));
    __m512 all = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(ce))),
                               _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(ce))));
    __m256 half = _mm256_add_ps(_mm512_castps512_ps256(all), _mm512_extractf32x8_ps(all, 1));
    return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

/* nv = d / 16 vectors per head (a constant where inlined): four query heads at a time in registers,
   four keys at a time reduced together */
static inline __attribute__((always_inline)) void key_scores_avx512(
        const float *q, int64_t group, const float *keys, int64_t start, int64_t count, int64_t nv,
        float scale, float score[][FR_KEYS]) {
    const __m128 scale4 = _mm_set1_ps(scale);
    for (int64_t h0 = 0; h0 < group; h0 += 4) {
        int64_t nh = group - h0 < 4 ? group - h0 : 4;
        __m512 qv[4][8];
        for (int64_t h = 0; h < nh; h++)
            for (int64_t c = 0; c < nv; c++) qv[h][c] = _mm512_loadu_ps(q + (h0 + h) * nv * 16 + c * 16);
        int64_t j = 0;
        for (; j + 4 <= count; j += 4) {
            int64_t k = (start + j) * nv * 16;  /* the first of the four keys' elements */
            __m512 acc[4][4];
            for (int64_t i = 0; i < 4; i++) {
                __m512 kv[8];
                for (int64_t c = 0; c < nv; c++) kv[c] = _mm512_loadu_ps(keys + k + i * nv * 16 + c * 16);
                for (int64_t h = 0; h < nh; h++) {
                    __m512 a = _mm512_mul_ps(qv[h][0], kv[0]);
                    for (int64_t c = 1; c < nv; c++) a = _mm512_fmadd_ps(qv[h][c], kv[c], a);
                    acc[h][i] = a;
                }
            }
            for (int64_t h = 0; h < nh; h++)
                _mm_storeu_ps(&score[h0 + h][j], _mm_mul_ps(sum4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]), scale4));
        }
        for (; j < count; j++) {
            int64_t k = (start + j) * nv * 16;
            for (int64_t h = 0; h < nh; h++) {
                __m512 a = _mm512_mul_ps(qv[h][0], _mm512_loadu_ps(keys + k));
                for (int64_t c = 1; c < nv; c++) a = _mm512_fmadd_ps(qv[h][c], _mm512_loadu_ps(keys + k + c * 16), a);
                score[h0 + h][j] = _mm512_reduce_add_ps(a) * scale;
            }
        }
    }
}

/* For heads [h0, h0 + nh) (nh <= most): out[h * stride ..] (d = 16 nv floats) = sum_j p[h][j] v_j over keys
   [start, start + count). Each value vector is loaded once for all nh heads; each head's sums run over j
   in order, as one head at a time would. */
static inline __attribute__((always_inline)) void weighted_values_avx512(
        float p[][FR_KEYS], int64_t h0, int64_t nh, int64_t most, const float *values, int64_t start,
        int64_t count, int64_t nv, float *out, int64_t stride) {
    __m512 sum[6][8];
    for (int64_t h = 0; h < most; h++)
        for (int64_t c = 0; c < nv; c++) sum[h][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < count; j++) {
        int64_t v = (start + j) * nv * 16;
        for (int64_t c = 0; c < nv; c++) {
            __m512 vc = _mm512_loadu_ps(values + v + c * 16);
            for (int64_t h = 0; h < most; h++)
                if (h < nh) sum[h][c] = _mm512_fmadd_ps(_mm512_set1_ps(p[h0 + h][j]), vc, sum[h][c]);
        }
    }
    for (int64_t h = 0; h < nh; h++)
        for (int64_t c = 0; c < nv; c++) _mm512_storeu_ps(out + (h0 + h) * stride + c * 16, sum[h][c]);
}
#endif

/* Scores of keys [start, start + count) for `group` query heads: score[h][j] = q_h . k_j * scale. */
static void key_scores(const float *q, int64_t group, const float *keys, int64_t start, int64_t count,
                       int64_t d, float scale, float score[][FR_KEYS]) {
#if defined(__AVX512F__)
    /* the common group sizes as constants, so the head loops unroll without a branch or a wasted head */
#define FR_SCORES(NV) switch (group) { \
        case 1: key_scores_avx512(q, 1, keys, start, count, NV, scale, score); return; \
        case 2: key_scores_avx512(q, 2, keys, start, count, NV, scale, score); return; \
        case 3: key_scores_avx512(q, 3, keys, start, count, NV, scale, score); return; \
        case 4: key_scores_avx512(q, 4, keys, start, count, NV, scale, score); return; \
        default: key_scores_avx512(q, group, keys, start, count, NV, scale, score); return; }
    if (d == 64) FR_SCORES(4)
    if (d == 128) FR_SCORES(8)
#undef FR_SCORES
#endif
    for (int64_t j = 0; j < count; j++) {
        const float *key = keys + (start + j) * d;
        for (int64_t h = 0; h < group; h++) {
            const float *qh = q + h * d;
            float s = 0.0f;
            #pragma omp simd reduction(+:s)
            for (int64_t t = 0; t < d; t++) s += qh[t] * key[t];
            score[h][j] = s * scale;
        }
    }
}

/* out[h * stride ..] (d floats) = sum_j p[h][j] v_j over keys [start, start + count), for every head h < group */
static void weighted_values(float p[][FR_KEYS], int64_t group, const float *values, int64_t start, int64_t count,
                            int64_t d, float *out, int64_t stride) {
#if defined(__AVX512F__)
    if (d == 64 && group <= 4) {  /* the common group sizes as constants (no branch per head) */
        switch (group) {
            case 1: weighted_values_avx512(p, 0, 1, 1, values, start, count, 4, out, stride); return;
            case 2: weighted_values_avx512(p, 0, 2, 2, values, start, count, 4, out, stride); return;
            case 3: weighted_values_avx512(p, 0, 3, 3, values, start, count, 4, out, stride); return;
            default: weighted_values_avx512(p, 0, 4, 4, values, start, count, 4, out, stride); return;
        }
    }
    if (d == 128 && group <= 3) {
        switch (group) {
            case 1: weighted_values_avx512(p, 0, 1, 1, values, start, count, 8, out, stride); return;
            case 2: weighted_values_avx512(p, 0, 2, 2, values, start, count, 8, out, stride); return;
            default: weighted_values_avx512(p, 0, 3, 3, values, start, count, 8, out, stride); return;
        }
    }
    if (d == 64) {  /* six heads' sums and a value vector in registers */
        for (int64_t h0 = 0; h0 < group; h0 += 6)
            weighted_values_avx512(p, h0, group - h0 < 6 ? group - h0 : 6, 6, values, start, count, 4, out, stride);
        return;
    }
    if (d == 128) {
        for (int64_t h0 = 0; h0 < group; h0 += 3)
            weighted_values_avx512(p, h0, group - h0 < 3 ? group - h0 : 3, 3, values, start, count, 8, out, stride);
        return;
    }
#endif
    for (int64_t h = 0; h < group; h++) {
        float *acc = out + h * stride;
        memset(acc, 0, sizeof(float) * (size_t)d);
        for (int64_t j = 0; j < count; j++)
            for (int64_t t = 0; t < d; t++) acc[t] += p[h][j] * values[(start + j) * d + t];
    }
}

/* One task of a decode step's attention: the query heads of one kv head of one sequence over keys
   [start, end); writes per head its largest score, the sum of weights and the weighted values. */
static void attend_part(const float *q, int64_t group, const float *keys, const float *values, int64_t start,
                        int64_t end, int64_t d, float scale, float *part) {
    float score[FR_GROUP][FR_KEYS];
    int64_t count = end - start;
    key_scores(q, group, keys, start, count, d, scale, score);
    for (int64_t h = 0; h < group; h++) {
        float top = score[h][0], total = 0.0f;
        for (int64_t j = 1; j < count; j++) top = score[h][j] > top ? score[h][j] : top;
        #pragma omp simd reduction(+:total)
        for (int64_t j = 0; j < count; j++) {
            score[h][j] = fr_exp(score[h][j] - top);
            total += score[h][j];
        }
        float *out = part + h * (d + 2);
        out[0] = top;
        out[1] = total;
    }
    weighted_values(score, group, values, start, count, d, part + 2, d + 2);
}

/* att [heads * d] of one (sequence, kv head) from its `n` tasks' parts: each part's weights rescaled by
   exp(its maximum - the largest maximum), summed, divided by the summed weights */
static void merge_parts(const float *parts, int64_t n, int64_t group, int64_t d, float *att) {
    for (int64_t a = 0; a < group; a++) {
        float top = -INFINITY, total = 0.0f, *dst = att + a * d;
        for (int64_t p = 0; p < n; p++) top = fmaxf(top, parts[(p * group + a) * (d + 2)]);
        memset(dst, 0, sizeof(float) * (size_t)d);
        for (int64_t p = 0; p < n; p++) {
            const float *part = parts + (p * group + a) * (d + 2);
            float w = fr_exp(part[0] - top);
            total += w * part[1];
            for (int64_t c = 0; c < d; c++) dst[c] += w * part[2 + c];
        }
        for (int64_t c = 0; c < d; c++) dst[c] /= total;
    }
}

/* The decoder layers of one decode step for `rows` sequences, one new token each.
 *
 * x [rows, hidden]: the tokens' embeddings in, the last layer's output out. cos, sin [rows, head_dim]:
 * the rotary tables at each token's position. keys[r], values[r]: sequence r's cache, [layers, kv_heads,
 * capacity[r], head_dim] float32, whose slots [0, length[r]) it attends to; the token's own K/V are
 * written at slot length[r] - 1 first. Returns 0, 1 when memory could not be had, 2 for a shape or weight
 * this build does not take (more than FR_GROUP query heads per kv head, head_dim above 512 or odd, tiled
 * weights without AVX-512).
 */
int fr_decode_layers(const fr_model *model, int64_t rows, float *x, const float *cos, const float *sin,
                     float *const *keys, float *const *values, const int64_t *capacity, const int64_t *length) {
    int64_t hidden = model->hidden, heads = model->heads, kvh = model->kv_heads, d = model->head_dim;
    int64_t inter = model->intermediate, group = heads / kvh, width = (heads + 2 * kvh) * d;
    if (group > FR_GROUP || d > 512 || d % 2) return 2;
    for (int64_t l = 0; l < model->layers; l++) {
        const fr_layer *layer = model->layer + l;
        for (int p = 0; p < 7; p++)
            if (layer->proj[p].tiled && !fr_quant_can_tile()) return 2;
    }
    int64_t tasks = 0;  /* attention tasks: FR_KEYS keys of one (sequence, kv head) each */
    for (int64_t r = 0; r < rows; r++) tasks += kvh * ((length[r] + FR_KEYS - 1) / FR_KEYS);
    int64_t widest = hidden > inter ? hidden : inter;
    size_t floats = (size_t)(rows * (hidden + width + heads * d + 2 * inter + hidden) + rows * (widest / 32 + 1)
                             + tasks * group * (d + 2));
    float *work = (float *)malloc(sizeof(float) * floats);
    int64_t *task_row = (int64_t *)malloc(sizeof(int64_t) * (size_t)(3 * tasks + 1));
    if (!work || !task_row) {
        free(work);
        free(task_row);
        return 1;
    }
    float *h = work, *qkv = h + rows * hidden, *att = qkv + rows * width, *gu = att + rows * heads * d;
    float *out = gu + rows * 2 * inter, *xs = out + rows * hidden, *parts = xs + rows * (widest / 32 + 1);
    int64_t *task_head = task_row + tasks, *task_start = task_head + tasks, t = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < kvh; g++)
            for (int64_t s = 0; s < length[r]; s += FR_KEYS, t++) {
                task_row[t] = r;
                task_head[t] = g;
                task_start[t] = s;
            }
    float scale = 1.0f / sqrtf((float)d);
    for (int64_t l = 0; l < model->layers; l++) {
        const fr_layer *layer = model->layer + l;
        rms_norm(x, layer->input_norm, rows, hidden, model->eps, h);
        project(layer->proj, 3, h, rows, qkv, width, heads * d, kvh * d, xs);
        for (int64_t r = 0; r < rows; r++) {
            float *row = qkv + r * width;
            if (layer->qkv_bias)
                for (int64_t i = 0; i < width; i++) row[i] += layer->qkv_bias[i];
            if (layer->q_norm) {  /* in place: each head's norm is taken before it is overwritten */
                rms_norm(row, layer->q_norm, heads, d, model->eps, row);
                rms_norm(row + heads * d, layer->k_norm, kvh, d, model->eps, row + heads * d);
            }
            for (int64_t a = 0; a < heads + kvh; a++) rotate(row + a * d, cos + r * d, sin + r * d, d);
            int64_t cap = capacity[r], slot = length[r] - 1;
            for (int64_t g = 0; g < kvh; g++) {
                size_t at = (size_t)(((l * kvh + g) * cap + slot) * d);
                memcpy(keys[r] + at, row + (heads + g) * d, sizeof(float) * (size_t)d);
                memcpy(values[r] + at, row + (heads + kvh + g) * d, sizeof(float) * (size_t)d);
            }
        }
        #pragma omp parallel for schedule(dynamic, 1)
        for (int64_t i = 0; i < tasks; i++) {
            int64_t r = task_row[i], g = task_head[i], s = task_start[i], e = s + FR_KEYS;
            size_t base = (size_t)((l * kvh + g) * capacity[r] * d);
            attend_part(qkv + r * width + g * group * d, group, keys[r] + base, values[r] + base, s, e < length[r] ? e : length[r], d,
                        scale, parts + i * group * (d + 2));
        }
        for (int64_t i = 0; i < tasks;) {  /* each (sequence, kv head)'s tasks are consecutive */
            int64_t r = task_row[i], g = task_head[i], n = 0;
            while (i + n < tasks && task_row[i + n] == r && task_head[i + n] == g) n++;
            merge_parts(parts + i * group * (d + 2), n, group, d, att + r * heads * d + g * group * d);
            i += n;
        }
        qlinear(&layer->proj[3], att, rows, out, hidden, xs);
        for (int64_t i = 0; i < rows * hidden; i++) x[i] += out[i];
        rms_norm(x, layer->post_norm, rows, hidden, model->eps, h);
        project(layer->proj + 4, 2, h, rows, gu, 2 * inter, inter, inter, xs);
        for (int64_t r = 0; r < rows; r++) {
            float *gate = gu + r * 2 * inter, *up = gate + inter, *act = gu + r * 2 * inter;
            #pragma omp simd
            for (int64_t i = 0; i < inter; i++) act[i] = gate[i] / (1.0f + fr_exp(-gate[i])) * up[i];
        }
        /* the activations sit at the start of each row's gate|up span: gather them into [rows, inter] */
        for (int64_t r = 1; r < rows; r++) memmove(gu + r * inter, gu + r * 2 * inter, sizeof(float) * (size_t)inter);
        qlinear(&layer->proj[6], gu, rows, out, hidden, xs);
        for (int64_t i = 0; i < rows * hidden; i++) x[i] += out[i];
    }
    free(work);
    free(task_row);
    return 0;
}

int fr_quant_has_avx2(void) {
#if defined(__AVX2__)
    return 1;
#else
    return 0;
#endif
}

/* Float32 rows w [n, k] (k a multiple of 32) into the blocks fr_quant_linear reads, the numbers of
 * cpu_quant.quantize_ref to the bit (round half to even, the scales rounded to half floats first, each
 * product and sum rounded as torch's separate operations round them); with tol >= 0 it also says
 * whether every block holds its values to within tol of its step, as quantize_exact asks.
 * Returns 1 (every block within tol, or tol < 0), 0 (not), -1 (this build has no F16C: use the
 * reference), -2 (a value is not finite or beyond half the half-float range). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off"))) /* each product and sum rounded on its own, as torch's ops */
#endif
int fr_quantize(int bits, const float *w, int64_t n, int64_t k, void *q, uint16_t *d, uint16_t *m, float tol) {
#if defined(__F16C__)
    const int64_t blocks = k / 32;
    int bad = 0, inexact = 0;
#pragma omp parallel for reduction(| : bad, inexact) schedule(static)
    for (int64_t r = 0; r < n; r++) {
        for (int64_t b = 0; b < blocks; b++) {
            const float *x = w + r * k + b * 32;
            const int64_t at = r * blocks + b;
            float lo = x[0], hi = x[0], amax = 0.0f, levels[32];
            int finite = 1;
            for (int i = 0; i < 32; i++) {
                const float v = x[i], a = fabsf(v);
                finite &= (a * 2.0f <= 65504.0f); /* false for NaN and infinities too */
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
                amax = a > amax ? a : amax;
            }
            bad |= !finite;
            float low = 0.0f, step;
            if (bits == 8) {
                d[at] = _cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT);
                step = half(d[at]);
            } else {
                m[at] = _cvtss_sh(lo, _MM_FROUND_TO_NEAREST_INT);
                low = half(m[at]);
                d[at] = _cvtss_sh((hi - low) / 15.0f, _MM_FROUND_TO_NEAREST_INT);
                step = half(d[at]);
            }
            const float div = step > 0.0f ? step : 1.0f, limit = tol * step;
            const float floor_level = bits == 8 ? -127.0f : 0.0f, top_level = bits == 8 ? 127.0f : 15.0f;
            int off = 0;
            for (int i = 0; i < 32; i++) {
                float level = rintf((x[i] - low) / div); /* round half to even; low is 0 for q8 */
                level = level < floor_level ? floor_level : (level > top_level ? top_level : level);
                levels[i] = level;
                const float scaled = level * step, value = scaled + low;
                off |= !(fabsf(value - x[i]) <= limit);
            }
            inexact |= tol >= 0.0f && off;
            if (bits == 8) {
                int8_t *out = (int8_t *)q + r * k + b * 32;
                for (int i = 0; i < 32; i++) out[i] = (int8_t)levels[i];
            } else {
                uint8_t *out = (uint8_t *)q + r * (k / 2) + b * 16;
                for (int i = 0; i < 16; i++) out[i] = (uint8_t)levels[i] | (uint8_t)((uint8_t)levels[i + 16] << 4);
            }
        }
    }
    return bad ? -2 : !inexact;
#else
    (void)bits; (void)w; (void)n; (void)k; (void)q; (void)d; (void)m; (void)tol;
    return -1;
#endif
}

/* Rotary embedding of float32 rows, written where the caller says (a cache's slots), in one pass:
 * for every batch b < batches (a layer and head) and row i < n,
 *   out[b * out_batch + slot_i * out_row + j] = x[b * x_batch + i * x_row + j] * cos[i * d + j] + r_j * sin[i * d + j]
 * with r = (-x[d/2:], x[:d/2]) of that row and slot_i = slots[i] (i where slots is NULL): transformers'
 * Llama rotation, each product and the sum rounded on their own, as torch's separate operations round
 * them (kernels/rotary.py rotate), so the bits are the same. d is even; rows are d contiguous floats. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
void fr_rotate_rows(const float *x, int64_t x_batch, int64_t x_row, int64_t batches, int64_t n, int64_t d,
                    const float *cos, const float *sin, float *out, int64_t out_batch, int64_t out_row,
                    const int64_t *slots) {
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
    const int64_t half = d / 2;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < batches; b++) {
        for (int64_t i = 0; i < n; i++) {
            const float *row = x + b * x_batch + i * x_row, *c = cos + i * d, *s = sin + i * d;
            float *dst = out + b * out_batch + (slots ? slots[i] : i) * out_row;
            #pragma omp simd
            for (int64_t j = 0; j < half; j++) dst[j] = row[j] * c[j] + (-row[j + half]) * s[j];
            #pragma omp simd
            for (int64_t j = half; j < d; j++) dst[j] = row[j] * c[j] + row[j - half] * s[j];
        }
    }
}

/* ---- prefill attention ---------------------------------------------------------------------- */

#define FR_ATT_ROWS 6   /* (query, head) rows of one task: their scores of a key chunk stay in registers */
#define FR_ATT_KEYS 64  /* keys per chunk */
#define FR_ATT_DIM 256  /* largest head_dim taken (a multiple of 64) */

#if defined(__AVX512F__)
/* exp of 16 floats: fr_exp's range reduction and polynomial, its constants (about 2 ulp) */
static inline __m512 fr_exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(FR_LOG2E), _mm512_set1_ps(0.5f)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(FR_LN2_LO), _mm512_fnmadd_ps(n, _mm512_set1_ps(FR_LN2_HI), x));
    __m512 p = _mm512_set1_ps(FR_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FR_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FR_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FR_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FR_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FR_EXP_P5));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

/* acc[r][0..64) += x[r * x_ld] * row[0..64) for the FR_ATT_ROWS rows: one step of both products of a
 * chunk (scores: a key dimension's values for 64 keys times each row's query element; outputs: a key's
 * value vector times each row's weight), 64 floats in 4 registers, 24 accumulators. */
static inline __attribute__((always_inline)) void rank_one(__m512 acc[FR_ATT_ROWS][4], const float *row,
                                                           const float *x, int64_t x_ld) {
    __m512 a = _mm512_loadu_ps(row), b = _mm512_loadu_ps(row + 16), c = _mm512_loadu_ps(row + 32),
           e = _mm512_loadu_ps(row + 48);
    for (int r = 0; r < FR_ATT_ROWS; r++) {
        __m512 w = _mm512_set1_ps(x[r * x_ld]);
        acc[r][0] = _mm512_fmadd_ps(w, a, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(w, b, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(w, c, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(w, e, acc[r][3]);
    }
}

/* Rows [r0, r0 + count) of one kv head's stacked rows (row r: query r / g, query head hk * g + r % g) over
 * the keys each row's query sees, [0, lim[query]). kt: the head's keys transposed, [d][kt_ld]. Online
 * softmax over chunks of FR_ATT_KEYS keys: a chunk's scores in registers (rows x 4 vectors), masked only
 * in chunks some row's limit falls into, then its weights times the chunk's values. */
static void attend_rows(const float *q, int64_t q_hs, int64_t q_rs, const float *kt, int64_t kt_ld,
                        const float *v, int64_t d, const int64_t *lim, int64_t g, int64_t hk, int64_t r0,
                        int64_t count, float scale, float *out, int64_t o_hs, int64_t o_rs) {
    float qs[FR_ATT_ROWS][FR_ATT_DIM], acc[FR_ATT_ROWS][FR_ATT_DIM], p[FR_ATT_ROWS][FR_ATT_KEYS];
    float top[FR_ATT_ROWS], total[FR_ATT_ROWS];
    int64_t seen[FR_ATT_ROWS], most = 0, least = INT64_MAX;
    for (int r = 0; r < FR_ATT_ROWS; r++) {  /* rows past count repeat the last one, seeing nothing */
        int64_t row = r0 + (r < count ? r : count - 1), i = row / g, h = hk * g + row % g;
        for (int64_t c = 0; c < d; c++) qs[r][c] = q[h * q_hs + i * q_rs + c] * scale;
        memset(acc[r], 0, sizeof(float) * (size_t)d);
        seen[r] = r < count ? lim[i] : 0;
        top[r] = -INFINITY;
        total[r] = 0.0f;
        most = seen[r] > most ? seen[r] : most;
        least = seen[r] < least ? seen[r] : least;
    }
    for (int64_t k0 = 0; k0 < most; k0 += FR_ATT_KEYS) {
        __m512 s[FR_ATT_ROWS][4];
        for (int r = 0; r < FR_ATT_ROWS; r++)
            for (int c = 0; c < 4; c++) s[r][c] = _mm512_setzero_ps();
        for (int64_t t = 0; t < d; t++) rank_one(s, kt + t * kt_ld + k0, &qs[0][t], FR_ATT_DIM);
        int partial = k0 + FR_ATT_KEYS > least;  /* some row sees only part of this chunk */
        for (int r = 0; r < FR_ATT_ROWS; r++) {
            if (partial)
                for (int c = 0; c < 4; c++) {
                    int64_t left = seen[r] - (k0 + 16 * c);
                    __mmask16 keep = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
                    s[r][c] = _mm512_mask_blend_ps(keep, _mm512_set1_ps(-INFINITY), s[r][c]);
                }
            float high = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(s[r][0], s[r][1]), _mm512_max_ps(s[r][2], s[r][3])));
            if (high == -INFINITY) {  /* nothing of this chunk seen by this row */
                memset(p[r], 0, sizeof p[r]);
                continue;
            }
            float now = high > top[r] ? high : top[r];
            float keep = top[r] == -INFINITY ? 0.0f : fr_exp(top[r] - now);
            __m512 shift = _mm512_set1_ps(now), sum = _mm512_setzero_ps();
            for (int c = 0; c < 4; c++) {
                __mmask16 live = _mm512_cmp_ps_mask(s[r][c], _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
                __m512 w = _mm512_maskz_mov_ps(live, fr_exp16(_mm512_sub_ps(s[r][c], shift)));
                sum = _mm512_add_ps(sum, w);
                _mm512_storeu_ps(p[r] + 16 * c, w);
            }
            total[r] = total[r] * keep + _mm512_reduce_add_ps(sum);
            top[r] = now;
            if (keep != 1.0f)
                for (int64_t c = 0; c < d; c++) acc[r][c] *= keep;
        }
        int64_t keys = most - k0 < FR_ATT_KEYS ? most - k0 : FR_ATT_KEYS;
        for (int64_t c0 = 0; c0 < d; c0 += 64) {  /* the weighted values, 64 dimensions at a time */
            __m512 o[FR_ATT_ROWS][4];
            for (int r = 0; r < FR_ATT_ROWS; r++)
                for (int c = 0; c < 4; c++) o[r][c] = _mm512_loadu_ps(acc[r] + c0 + 16 * c);
            for (int64_t j = 0; j < keys; j++) rank_one(o, v + (k0 + j) * d + c0, &p[0][j], FR_ATT_KEYS);
            for (int r = 0; r < FR_ATT_ROWS; r++)
                for (int c = 0; c < 4; c++) _mm512_storeu_ps(acc[r] + c0 + 16 * c, o[r][c]);
        }
    }
    for (int r = 0; r < count; r++) {
        int64_t row = r0 + r, i = row / g, h = hk * g + row % g;
        float inv = total[r] > 0.0f ? 1.0f / total[r] : 0.0f;
        for (int64_t c = 0; c < d; c++) out[h * o_hs + i * o_rs + c] = acc[r][c] * inv;
    }
}
#endif

/* Attention of a prefill's queries over a prefix of the cache each: out[h][i] (d floats) = softmax over
 * keys j < lim[i] of q[h][i] . k[h / g][j] / sqrt(d), times v[h / g][j], for query heads h < heads
 * (g = heads / kv_heads heads per key/value head) and queries i < n. q: element [h][i][c] at
 * h * q_hs + i * q_rs + c; keys and values: [kv_heads][rows][d], head kv_hs apart, rows d floats; out like
 * q with o_hs, o_rs. Each key/value head's keys are transposed once into a scratch buffer; then the rows
 * of its query heads, queries side by side, go FR_ATT_ROWS at a time to a thread. A query that sees no key
 * gets zeros. Returns 0, 1 when memory could not be had, 2 for what this build does not take (no
 * AVX-512, d not a multiple of 64 up to FR_ATT_DIM, heads not a multiple of kv_heads). */
int fr_attend_prefix(const float *q, int64_t q_hs, int64_t q_rs, const float *k, const float *v, int64_t kv_hs,
                     const int64_t *lim, int64_t n, int64_t heads, int64_t kv_heads, int64_t d, float *out,
                     int64_t o_hs, int64_t o_rs) {
#if defined(__AVX512F__)
    if (d % 64 || d > FR_ATT_DIM || kv_heads < 1 || heads % kv_heads) return 2;
    int64_t g = heads / kv_heads, most = 0;
    for (int64_t i = 0; i < n; i++) most = lim[i] > most ? lim[i] : most;
    if (n == 0) return 0;
    int64_t ld = (most + FR_ATT_KEYS - 1) / FR_ATT_KEYS * FR_ATT_KEYS;  /* whole chunks, zeros past the keys */
    float *kt = (float *)malloc(sizeof(float) * (size_t)(kv_heads * d * ld + 1));
    if (!kt) return 1;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int64_t hk = 0; hk < kv_heads; hk++)
        for (int64_t t = 0; t < d; t++) {
            float *row = kt + (hk * d + t) * ld;
            for (int64_t j = 0; j < ld; j++) row[j] = j < most ? k[hk * kv_hs + j * d + t] : 0.0f;
        }
    int64_t rows = n * g, blocks = (rows + FR_ATT_ROWS - 1) / FR_ATT_ROWS;
    float scale = 1.0f / sqrtf((float)d);
    #pragma omp parallel for schedule(dynamic, 2)
    for (int64_t task = 0; task < kv_heads * blocks; task++) {
        int64_t hk = task / blocks, r0 = task % blocks * FR_ATT_ROWS;
        attend_rows(q, q_hs, q_rs, kt + hk * d * ld, ld, v + hk * kv_hs, d, lim, g, hk, r0,
                    rows - r0 < FR_ATT_ROWS ? rows - r0 : FR_ATT_ROWS, scale, out, o_hs, o_rs);
    }
    free(kt);
    return 0;
#else
    (void)q; (void)q_hs; (void)q_rs; (void)k; (void)v; (void)kv_hs; (void)lim; (void)n; (void)heads;
    (void)kv_heads; (void)d; (void)out; (void)o_hs; (void)o_rs;
    return 2;
#endif
}
