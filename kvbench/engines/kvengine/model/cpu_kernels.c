/* Our engine's CPU kernels (loaded by cpu_kernels.py), by family:
   - the fp8 KV codec, fused with the gather and the scatter of token rows (kv_decode, kv_encode; this comment);
   - paged attention straight over the pages, fp8 decoded on the fly (kv_decode_attention, kv_prefill_attention);
   - the model's row kernels: linear_rows (few-row linears), rope, silu_mul.

   The codec.

   With AVX2 and F16C (x86 since 2013): decode 16 values a step through the fp16 converter, encode 8 a step by
   the integer steps below on 8 lanes. Elsewhere, and for the tail of a row, per value: decode builds the value's
   fp32 bits from the byte with integer operations (no table); encode is round-to-nearest-even with saturation,
   the same rule as torch's casts (c10's fp8 conversions). Both builds are tested bit for bit against torch
   (`fp8.decode`'s table, torch's cast).
   Arithmetic follows fp8.py's torch order exactly: decode  v * scale  (+ shift);  encode  (x - shift) / scale,
   clamped to the format's max. Built with -ffp-contract=off so that no multiply-add is fused.

   Formats: 0 = float8_e4m3fn (no inf, NaN = S.1111.111), 1 = float8_e5m2 (the top byte of an IEEE fp16).
   Rows are heads * dim values; `slots` (may be NULL: rows 0..n-1) names the stored row of each token; scale is
   one float (tensor mode) or [heads * dim] (channel mode); shift (NULL in tensor mode) is bf16 [rows, heads]
   for decode, and the tokens' [n, heads], computed, for encode.
   Both return 0, or 1 + the index of the first slot outside [0, num_rows) (checked before anything is read
   or written; without slots, num_rows + 1 when the n tokens do not fit). */
#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__)
#include <immintrin.h>
#endif

static inline float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float decode_e4m3(uint8_t b) {
    uint32_t e = (b >> 3) & 0xF, m = b & 7;
    float v = e ? from_bits(((e + 120u) << 23) | (m << 20)) : (float)m * 0x1p-9f;
    v = (b & 0x7F) == 0x7F ? NAN : v;
    return (b & 0x80) ? -v : v;
}

static inline float decode_e5m2(uint8_t b) {
    uint32_t e = (b >> 2) & 0x1F, m = b & 3;
    float v = e ? from_bits(((e + 112u) << 23) | (m << 21)) : (float)m * 0x1p-16f;
    v = e == 31 ? (m ? NAN : INFINITY) : v;
    return (b & 0x80) ? -v : v;
}

/* Branch-free (all three cases computed, one selected) so that the compiler vectorizes the loop. */
static inline uint8_t encode_e4m3(float f) {
    uint32_t bits = to_bits(f), sign = bits & 0x80000000u;
    bits ^= sign;
    /* below 2^-6: subnormal, rounded to a multiple of 2^-9 by adding 2^14 */
    uint32_t sub = to_bits(from_bits(bits) + from_bits(141u << 23)) - (141u << 23);
    uint32_t normal = (bits + ((uint32_t)(7 - 127) << 23) + 0x7FFFFu + ((bits >> 20) & 1)) >> 20;
    /* >= 480 or NaN: NaN (inputs are clamped to 448 first, so only a NaN gets here) */
    uint32_t r = bits >= (1087u << 20) ? 0x7Fu : (bits < (121u << 23) ? sub : normal);
    return (uint8_t)(r | (sign >> 24));
}

static inline uint8_t encode_e5m2(float f) {
    uint32_t bits = to_bits(f), sign = bits & 0x80000000u;
    bits ^= sign;
    /* below 2^-14: subnormal, rounded to a multiple of 2^-16 by adding 2^7 */
    uint32_t sub = to_bits(from_bits(bits) + from_bits(134u << 23)) - (134u << 23);
    uint32_t normal = (bits + ((uint32_t)(15 - 127) << 23) + 0xFFFFFu + ((bits >> 21) & 1)) >> 21;
    /* >= 65536, inf or NaN */
    uint32_t top = bits > (255u << 23) ? 0x7Fu : 0x7Cu;
    uint32_t r = bits >= (143u << 23) ? top : (bits < (113u << 23) ? sub : normal);
    return (uint8_t)(r | (sign >> 24));
}

/* 1 + the index of the first slot outside [0, num_rows), or 0: checked before anything is read or written. */
static int64_t first_bad_slot(const int64_t *slots, int64_t n, int64_t num_rows) {
    if (!slots) return n > num_rows ? num_rows + 1 : 0;
    for (int64_t i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= num_rows) return i + 1;
    return 0;
}

static inline float bf16(uint16_t h) { return from_bits((uint32_t)h << 16); }

/* fp32 -> bf16, round to nearest even; NaN -> 0x7FC0 (c10's rule, what torch's .to(torch.bfloat16) does). */
static inline uint16_t to_bf16(float f) {
    uint32_t u = to_bits(f);
    if (isnan(f)) return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

/* A channel-mode token's shift: sum over d of x[d] * weight[d], added in `fp8.token_shift`'s fixed pairwise
   order (element i + element i + half, halving, an odd last one carried), rounded to bf16. */
static inline uint16_t head_shift(const float *x, const float *weight, int64_t dim, float *buf) {
    int64_t m = dim;
#if defined(__AVX2__)
    if (dim % 16 == 0) {  /* the halvings whose halves are whole 8-lane vectors, on vectors: the same adds */
        for (int64_t d = 0; d < dim; d += 8)
            _mm256_storeu_ps(buf + d, _mm256_mul_ps(_mm256_loadu_ps(x + d), _mm256_loadu_ps(weight + d)));
        for (; m % 16 == 0; m /= 2)
            for (int64_t i = 0; i < m / 2; i += 8)
                _mm256_storeu_ps(buf + i, _mm256_add_ps(_mm256_loadu_ps(buf + i), _mm256_loadu_ps(buf + i + m / 2)));
    } else
#endif
    for (int64_t d = 0; d < dim; d++) buf[d] = x[d] * weight[d];
    while (m > 1) {
        const int64_t half = m / 2;
        for (int64_t i = 0; i < half; i++) buf[i] = buf[i] + buf[i + half];
        if (m % 2) buf[half] = buf[2 * half];
        m = half + m % 2;
    }
    return to_bf16(buf[0]);
}

#if defined(__AVX2__) && defined(__F16C__)
#define SIMD 8    /* values per encode step */
#define DECODE_STEP 16
/* 16 fp8 bytes -> their 16 fp16 bit patterns: an e5m2 byte is the top byte of its fp16. An e4m3 byte's exponent
   and mantissa, moved into fp16's fields ((b + sign) << 7 carries the sign from bit 14 to bit 15), read as fp16
   give the value / 2^8 (subnormals too), exactly; the callers multiply that 2^8 back in with the scale. */
static inline __m256i fp16_bits16(int format, const uint8_t *src) {
    __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)src));
    if (format == 1) return _mm256_slli_epi16(b, 8);
    __m256i h = _mm256_slli_epi16(_mm256_add_epi16(b, _mm256_and_si256(b, _mm256_set1_epi16(0x80))), 7);
    /* S.1111.111 is NaN: set all fp16 exponent bits over its non-zero mantissa */
    __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7F)), _mm256_set1_epi16(0x7F));
    return _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7C00)));
}
static inline __m256 low8(__m256i h) { return _mm256_cvtph_ps(_mm256_castsi256_si128(h)); }
static inline __m256 high8(__m256i h) { return _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)); }
#else
#define SIMD 0
#endif

#define DECODE_LOOP(DEC, FMT)                                                                       \
    for (int64_t i = 0; i < n; i++) {                                                            \
        int64_t row = slots ? slots[i] : i;                                                      \
        const uint8_t *src = rows + row * width;                                                 \
        float *dst = out + i * width;                                                            \
        if (!channel) {                                                                          \
            int64_t j = 0;                                                                       \
            if (simd) j = decode_row_simd(FMT, src, dst, width, scale[0]);                       \
            for (; j < width; j++) dst[j] = DEC(src[j]) * scale[0];                              \
            continue;                                                                            \
        }                                                                                        \
        for (int64_t h = 0; h < heads; h++) {                                                    \
            const float t = bf16(shift[row * heads + h]);                                        \
            const float *sc = scale + h * dim;                                                   \
            const uint8_t *src_h = src + h * dim;                                                \
            float *dst_h = dst + h * dim;                                                        \
            int64_t d = 0;                                                                       \
            if (simd) d = decode_head_simd(FMT, src_h, dst_h, dim, sc, t);                       \
            for (; d < dim; d++) dst_h[d] = DEC(src_h[d]) * sc[d] + t;                           \
        }                                                                                        \
    }

#if SIMD
/* The SIMD part of a row (tensor scale) or a head (channel scale and shift): how many values it did. The fp16
   view's e4m3 values are multiplied by scale * 2^8, in one multiply: the product is exact where it is finite
   (a power of two only moves the exponent; `kv_decode` checks), so v * (2^8 scale) rounds once, as
   (v 2^8) * scale does. */
static inline int64_t decode_row_simd(int format, const uint8_t *src, float *dst, int64_t count, float scale) {
    const __m256 s = _mm256_set1_ps(format == 1 ? scale : scale * 256.0f);
    int64_t j = 0;
    for (; j + DECODE_STEP <= count; j += DECODE_STEP) {
        __m256i h = fp16_bits16(format, src + j);
        _mm256_storeu_ps(dst + j, _mm256_mul_ps(low8(h), s));
        _mm256_storeu_ps(dst + j + 8, _mm256_mul_ps(high8(h), s));
    }
    return j;
}

static inline int64_t decode_head_simd(int format, const uint8_t *src, float *dst, int64_t count, const float *scale,
                                       float shift) {
    const __m256 t = _mm256_set1_ps(shift), pow8 = _mm256_set1_ps(format == 1 ? 1.0f : 256.0f);
    int64_t j = 0;
    for (; j + DECODE_STEP <= count; j += DECODE_STEP) {
        __m256i h = fp16_bits16(format, src + j);
        __m256 lo = _mm256_mul_ps(low8(h), _mm256_mul_ps(_mm256_loadu_ps(scale + j), pow8));
        __m256 hi = _mm256_mul_ps(high8(h), _mm256_mul_ps(_mm256_loadu_ps(scale + j + 8), pow8));
        _mm256_storeu_ps(dst + j, _mm256_add_ps(lo, t));
        _mm256_storeu_ps(dst + j + 8, _mm256_add_ps(hi, t));
    }
    return j;
}

/* 8 floats (already clamped) -> 8 fp8 bytes: `encode_e4m3` / `encode_e5m2` on 8 lanes, the same integer steps. */
#define ENCODE8(NAME, SUB_MAGIC, MIN_NORMAL, TOP, BIAS_ROUND, SHIFT, TOP_CODE)                       \
    static inline void NAME(__m256 v, uint8_t *dst) {                                                \
        __m256i bits = _mm256_castps_si256(v);                                                       \
        __m256i sign = _mm256_and_si256(bits, _mm256_set1_epi32((int)0x80000000u));                  \
        __m256i a = _mm256_xor_si256(bits, sign);                                                    \
        __m256i magic = _mm256_set1_epi32((int)(SUB_MAGIC));                                         \
        __m256i sub = _mm256_sub_epi32(                                                              \
            _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(magic))), magic); \
        __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, SHIFT), _mm256_set1_epi32(1));           \
        __m256i normal = _mm256_srli_epi32(                                                          \
            _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32((int)(BIAS_ROUND))), odd), SHIFT); \
        __m256i r = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(MIN_NORMAL)), a)); \
        r = _mm256_blendv_epi8(r, TOP_CODE, _mm256_cmpgt_epi32(a, _mm256_set1_epi32((int)(TOP) - 1)));      \
        r = _mm256_or_si256(r, _mm256_srli_epi32(sign, 24));                                         \
        const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, \
                                                   0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1); \
        __m256i p = _mm256_shuffle_epi8(r, low_bytes);                                               \
        int32_t lo = _mm_cvtsi128_si32(_mm256_castsi256_si128(p));                                   \
        int32_t hi = _mm_cvtsi128_si32(_mm256_extracti128_si256(p, 1));                              \
        memcpy(dst, &lo, 4);                                                                         \
        memcpy(dst + 4, &hi, 4);                                                                     \
    }
ENCODE8(encode8_e4m3, 141u << 23, 121u << 23, 1087u << 20, ((uint32_t)(7 - 127) << 23) + 0x7FFFFu, 20,
        _mm256_set1_epi32(0x7F))
ENCODE8(encode8_e5m2, 134u << 23, 113u << 23, 143u << 23, ((uint32_t)(15 - 127) << 23) + 0xFFFFFu, 21,
        _mm256_blendv_epi8(_mm256_set1_epi32(0x7C), _mm256_set1_epi32(0x7F),
                           _mm256_cmpgt_epi32(a, _mm256_set1_epi32((int)(255u << 23)))))

static inline __m256 clamp8(__m256 v, float limit) {  /* NaN stays NaN, as in torch's clamp */
    return _mm256_max_ps(_mm256_set1_ps(-limit), _mm256_min_ps(_mm256_set1_ps(limit), v));
}

/* The SIMD part of a row (tensor scale) or a head (channel scale and shift): how many values it did. */
#define ENCODE_SIMD(ROW, HEAD, ENC8)                                                                 \
    static inline int64_t ROW(const float *src, uint8_t *dst, int64_t count, float scale, float limit) { \
        const __m256 s = _mm256_set1_ps(scale);                                                      \
        int64_t j = 0;                                                                               \
        for (; j + SIMD <= count; j += SIMD)                                                         \
            ENC8(clamp8(_mm256_div_ps(_mm256_loadu_ps(src + j), s), limit), dst + j);                \
        return j;                                                                                    \
    }                                                                                                \
    static inline int64_t HEAD(const float *src, uint8_t *dst, int64_t count, const float *scale, float shift, \
                               float limit) {                                                        \
        const __m256 t = _mm256_set1_ps(shift);                                                      \
        int64_t j = 0;                                                                               \
        for (; j + SIMD <= count; j += SIMD) {                                                       \
            __m256 v = _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(src + j), t), _mm256_loadu_ps(scale + j)); \
            ENC8(clamp8(v, limit), dst + j);                                                         \
        }                                                                                            \
        return j;                                                                                    \
    }
ENCODE_SIMD(encode_row_e4m3, encode_head_e4m3, encode8_e4m3)
ENCODE_SIMD(encode_row_e5m2, encode_head_e5m2, encode8_e5m2)
#else
static inline int64_t decode_row_simd(int f, const uint8_t *s, float *d, int64_t c, float k) { return 0; }
static inline int64_t decode_head_simd(int f, const uint8_t *s, float *d, int64_t c, const float *k, float t) {
    return 0;
}
#define ENCODE_STUBS(ROW, HEAD)                                                                      \
    static inline int64_t ROW(const float *s, uint8_t *d, int64_t c, float k, float l) { return 0; } \
    static inline int64_t HEAD(const float *s, uint8_t *d, int64_t c, const float *k, float t, float l) { return 0; }
ENCODE_STUBS(encode_row_e4m3, encode_head_e4m3)
ENCODE_STUBS(encode_row_e5m2, encode_head_e5m2)
#endif

int64_t kv_decode(int format, const uint8_t *rows, int64_t num_rows, const int64_t *slots, int64_t n, int64_t heads,
                  int64_t dim, const float *scale, int channel, const uint16_t *shift, float *out) {
    const int64_t bad = first_bad_slot(slots, n, num_rows);
    if (bad) return bad;
    const int64_t width = heads * dim;
    int simd = SIMD > 0;  /* and every scale * 2^8 finite */
    for (int64_t k = 0; k < (channel ? width : 1); k++) simd &= isfinite(scale[k] * 256.0f);
    if (format == 0) {
        DECODE_LOOP(decode_e4m3, 0)
    } else {
        DECODE_LOOP(decode_e5m2, 1)
    }
    return 0;
}

#define ENCODE_LOOP(ENC, ROW_SIMD, HEAD_SIMD)                                                        \
    for (int64_t i = 0; i < n; i++) {                                                            \
        int64_t row = slots ? slots[i] : i;                                                      \
        const float *src = x + i * width;                                                        \
        uint8_t *dst = rows + row * width;                                                       \
        if (!channel) {                                                                          \
            const float s = scale[0];                                                            \
            for (int64_t j = ROW_SIMD(src, dst, width, s, limit); j < width; j++) {              \
                float v = src[j] / s;                                                            \
                dst[j] = ENC(v > limit ? limit : (v < -limit ? -limit : v));                     \
            }                                                                                    \
            continue;                                                                            \
        }                                                                                        \
        for (int64_t h = 0; h < heads; h++) {                                                    \
            const float *sc = scale + h * dim;                                                   \
            const float *src_h = src + h * dim;                                                  \
            uint8_t *dst_h = dst + h * dim;                                                      \
            shift[i * heads + h] = head_shift(src_h, weight + h * dim, dim, buf);                \
            const float t = bf16(shift[i * heads + h]);                                          \
            for (int64_t d = HEAD_SIMD(src_h, dst_h, dim, sc, t, limit); d < dim; d++) {         \
                float v = (src_h[d] - t) / sc[d];                                                \
                dst_h[d] = ENC(v > limit ? limit : (v < -limit ? -limit : v));                   \
            }                                                                                    \
        }                                                                                        \
    }

/* Channel mode computes each token's shift (`head_shift`, from `weight` [heads * dim]) and writes it to
   shift [n, heads]: the tokens' own shifts, which the caller stores beside the bytes. */
int64_t kv_encode(int format, const float *x, const int64_t *slots, int64_t n, int64_t heads, int64_t dim,
                  const float *scale, int channel, const float *weight, uint16_t *shift, uint8_t *rows,
                  int64_t num_rows) {
    const int64_t bad = first_bad_slot(slots, n, num_rows);
    if (bad) return bad;
    const int64_t width = heads * dim;
    float buf[dim > 0 ? dim : 1];
    if (format == 0) {
        const float limit = 448.0f;
        ENCODE_LOOP(encode_e4m3, encode_row_e4m3, encode_head_e4m3)
    } else {
        const float limit = 57344.0f;
        ENCODE_LOOP(encode_e5m2, encode_row_e5m2, encode_head_e5m2)
    }
    return 0;
}

/* Decode attention over pages: one query per sequence, read straight from the page table (no gather), fp32 or
   fp8 pages (tensor scale). A work item is a part of one sequence's keys (whole blocks, about
   DECODE_PARTS_PER_THREAD parts a thread, so that one long sequence still keeps every thread busy) with all its
   query heads: a key's stored row (all kv heads, contiguous) is read in one go, so the reads stream through a
   page instead of taking one head's 256 bytes of every 768 as one item per (sequence, kv head) did (30 layers
   of 4 sequences x 540 keys, scattered pages, 2 AVX-512 cores, alternated: fp32 15.0 -> 12.5 ms, e4m3 9.6 ->
   8.8). A part walks its keys a block of ATT_BLOCK at a time (an online softmax, as flash-decoding does): every
   query head is scored against the block's keys, the block's scores exponentiated against the running max
   (8 lanes at a time, `exp8`), the running sums and outputs rescaled when the max grows, and the block's values
   summed in; then a sequence's parts are merged, each weighed by e^(its max - their max). Each row read asks for
   the one KEY_AHEAD reads later, into the next block's keys. fp32 rows are read key by key straight from the
   pages (memory-bound: one key's work between two requests keeps more of them in flight); fp8 rows are
   compute-bound, so KEY_GROUP of them are decoded (codec above, scale 1) into a buffer, their scores' sums
   reduced together (`qk_keys`) and their values added into register tiles (`pv_keys`): 30 layers of 4 x 540
   e4m3 keys, 2 AVX-512 cores, 5.8-6.1 -> 4.7-5.0 ms; grouped fp32 ran 5-25% slower than key by key. The
   layer's tensor scales are folded into the query (k_scale * sm_scale) and into the output (v_scale). Not
   bit-equal to SDPA over gathered values (another summation order, a polynomial e^x within 2 ulp of expf):
   tested against float64 attention and the reference attention within fp32 rounding.

   format: -1 fp32 pages, 0 e4m3, 1 e5m2. k_rows / v_rows: the layer's [num_pages * page_size, kv_heads, dim].
   q [*, q_heads, dim] fp32 and out (the same shape): sequence s reads and writes row q_rows[s]. page_table
   [num_seqs, width] (row s lists sequence s's pages in order), lens [num_seqs] keys per sequence.
   Returns 0, 1 + the first sequence whose pages or length are out of range (checked before anything is read
   or written), or -1 when its buffers cannot be allocated. */
#define ATT_BLOCK 64  /* keys per block: a block's scores and row offsets stay in L1 */
#if defined(__AVX2__) && defined(__FMA__)
/* the sum of v's 8 lanes */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
static inline float dot_f32(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps(), acc2 = acc;  /* two chains of multiply-adds: half the latency */
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc2);
    }
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float r = hsum8(_mm256_add_ps(acc, acc2));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}
static inline void axpy_f32(float a, const float *x, float *y, int64_t n) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
/* e^x on 8 lanes (Cephes' expf: x = n ln2 + r, |r| <= ln2/2, a degree-5 polynomial in r, times 2^n); x below
   -87.3 (e^x under FLT_MIN) gives e^-87.3, not 0: nothing a softmax over scores can tell apart. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
/* s[0..n) = e^(s - top), returning their sum */
static inline float exp_sum(float *s, int64_t n, float top) {
    const __m256 t = _mm256_set1_ps(top);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), t));
        _mm256_storeu_ps(s + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum8(acc);
    for (; i < n; i++) { s[i] = expf(s[i] - top); sum += s[i]; }
    return sum;
}
#else
static inline float dot_f32(const float *a, const float *b, int64_t n) {
    float r = 0.0f;
    for (int64_t i = 0; i < n; i++) r += a[i] * b[i];
    return r;
}
static inline void axpy_f32(float a, const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}
static inline float exp_sum(float *s, int64_t n, float top) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) { s[i] = expf(s[i] - top); sum += s[i]; }
    return sum;
}
#endif

/* M rows in tiles of ROWS rows, r0 the tile's first: a constant count for the full tiles (so that the compiler
   keeps their accumulators in registers), then the rows left over */
#define TILED(M, ROWS, CALL_FULL, CALL_TAIL)                                                                \
    do {                                                                                                    \
        int64_t r0 = 0;                                                                                     \
        for (; r0 + (ROWS) <= (M); r0 += (ROWS)) CALL_FULL;                                                 \
        if (r0 < (M)) CALL_TAIL;                                                                            \
    } while (0)

#define KEY_GROUP 8  /* keys whose scores one pass computes: their 8 sums reduced together */
#define PV_ROWS 3     /* query rows a pass adds values into: 3 rows x 32 values is 12 registers */
#if defined(__AVX2__) && defined(__FMA__)
/* [sum(a[0]), .., sum(a[7])]: the 8 horizontal sums in 7 operations, not 8 x 5 */
static inline __m256 hsum8x8(const __m256 *a) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
/* s[g * lds + j] = Q[g] . k[j] for rows g < R and keys j < n <= KEY_GROUP (key rows at kp[0..KEY_GROUP), those
   past n any readable row): a query row's 8 vectors meet each key's in its own accumulator */
static inline void qk_keys(int64_t R, const float *Q, int64_t dim, const float *const *kp, int64_t n, float *s,
                           int64_t lds) {
    const int64_t d8 = dim / 8 * 8;
    for (int64_t g = 0; g < R; g++) {
        const float *qg = Q + g * dim;
        __m256 a[KEY_GROUP];
        for (int j = 0; j < KEY_GROUP; j++) a[j] = _mm256_setzero_ps();
        for (int64_t d = 0; d < d8; d += 8) {
            const __m256 x = _mm256_loadu_ps(qg + d);
            for (int j = 0; j < KEY_GROUP; j++) a[j] = _mm256_fmadd_ps(x, _mm256_loadu_ps(kp[j] + d), a[j]);
        }
        float r[KEY_GROUP];
        _mm256_storeu_ps(r, hsum8x8(a));
        for (int64_t j = 0; j < n; j++) {
            for (int64_t d = d8; d < dim; d++) r[j] += qg[d] * kp[j][d];
            s[g * lds + j] = r[j];
        }
    }
}
/* o[r] += sum_j p[r * ldp + j] v[j] for R <= PV_ROWS rows over n value rows at vp[j], 32 values at a time in
   registers */
static inline __attribute__((always_inline)) void pv_keys_tile(int R, const float *p, int64_t ldp,
                                                               const float *const *vp, int64_t n, float *o,
                                                               int64_t dim) {
    int64_t c = 0;
    for (; c + 32 <= dim; c += 32) {
        __m256 a[PV_ROWS][4];
        for (int r = 0; r < R; r++)
            for (int k = 0; k < 4; k++) a[r][k] = _mm256_loadu_ps(o + r * dim + c + 8 * k);
        for (int64_t j = 0; j < n; j++) {
            const float *v = vp[j] + c;
            const __m256 b0 = _mm256_loadu_ps(v), b1 = _mm256_loadu_ps(v + 8);
            const __m256 b2 = _mm256_loadu_ps(v + 16), b3 = _mm256_loadu_ps(v + 24);
            for (int r = 0; r < R; r++) {
                const __m256 x = _mm256_broadcast_ss(p + r * ldp + j);
                a[r][0] = _mm256_fmadd_ps(x, b0, a[r][0]);
                a[r][1] = _mm256_fmadd_ps(x, b1, a[r][1]);
                a[r][2] = _mm256_fmadd_ps(x, b2, a[r][2]);
                a[r][3] = _mm256_fmadd_ps(x, b3, a[r][3]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int k = 0; k < 4; k++) _mm256_storeu_ps(o + r * dim + c + 8 * k, a[r][k]);
    }
    if (c < dim)  /* values past the last multiple of 32 */
        for (int r = 0; r < R; r++)
            for (int64_t j = 0; j < n; j++) axpy_f32(p[r * ldp + j], vp[j] + c, o + r * dim + c, dim - c);
}
#else
static inline void qk_keys(int64_t R, const float *Q, int64_t dim, const float *const *kp, int64_t n, float *s,
                           int64_t lds) {
    for (int64_t g = 0; g < R; g++)
        for (int64_t j = 0; j < n; j++) s[g * lds + j] = dot_f32(Q + g * dim, kp[j], dim);
}
static inline void pv_keys_tile(int R, const float *p, int64_t ldp, const float *const *vp, int64_t n, float *o,
                                int64_t dim) {
    for (int r = 0; r < R; r++)
        for (int64_t j = 0; j < n; j++) axpy_f32(p[r * ldp + j], vp[j], o + r * dim, dim);
}
#endif
/* pv_keys_tile over any number of rows, PV_ROWS at a time */
static inline void pv_keys(int64_t R, const float *p, int64_t ldp, const float *const *vp, int64_t n, float *o,
                           int64_t dim) {
    TILED(R, PV_ROWS, pv_keys_tile(PV_ROWS, p + r0 * ldp, ldp, vp, n, o + r0 * dim, dim),
          pv_keys_tile((int)(R - r0), p + r0 * ldp, ldp, vp, n, o + r0 * dim, dim));
}

#define KEY_AHEAD 8  /* reads ahead that a row is asked for */
#define DECODE_PARTS_PER_THREAD 4  /* decode work items a thread, about: sequences split into parts of keys */
/* Key t's row in the stored rows, t's page found in the sequence's `pages` */
static inline int64_t stored_row(const int64_t *pages, int64_t page_size, int64_t t) {
    return pages[t / page_size] * page_size + t % page_size;
}

/* Asks for the cache lines of one stored row (dim values of 4 bytes, or 1 for fp8) */
static inline void prefetch_row(const void *base, int format, int64_t index, int64_t dim) {
    const char *at = format < 0 ? (const char *)((const float *)base + index) : (const char *)base + index;
    const int64_t bytes = format < 0 ? 4 * dim : dim;
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(at + b);
}

/* Values of one stored row of `dim` values at scale 1: the fp32 row itself, or the fp8 bytes decoded into buf. */
static inline const float *kv_row(int format, const void *base, int64_t index, int64_t dim, float *buf) {
    if (format < 0) return (const float *)base + index;
    const uint8_t *src = (const uint8_t *)base + index;
    int64_t j = SIMD ? decode_row_simd(format, src, buf, dim, 1.0f) : 0;
    for (; j < dim; j++) buf[j] = format == 0 ? decode_e4m3(src[j]) : decode_e5m2(src[j]);
    return buf;
}

/* Asks for read `pos` of a block whose reads are, in order: its n key rows (offsets at[]), its n value rows,
   then the next block's n_next key rows (next[]); nothing past the last */
static inline __attribute__((always_inline)) void prefetch_read(int format, const void *k_rows, const void *v_rows,
                                                                const int64_t *at, const int64_t *next, int64_t n,
                                                                int64_t n_next, int64_t width, int64_t pos) {
    if (pos < n) prefetch_row(k_rows, format, at[pos], width);
    else if (pos < 2 * n) prefetch_row(v_rows, format, at[pos - n], width);
    else if (pos - 2 * n < n_next) prefetch_row(k_rows, format, next[pos - 2 * n], width);
}

int64_t kv_decode_attention(int format, const void *k_rows, const void *v_rows, int64_t num_pages,
                            int64_t page_size, int64_t kv_heads, int64_t dim, float k_scale, float v_scale,
                            const float *q, const int64_t *q_rows, int64_t q_heads, int64_t num_seqs,
                            const int64_t *page_table, int64_t width, const int64_t *lens, float sm_scale,
                            float *out, int threads) {
    int64_t total = 0;
    for (int64_t s = 0; s < num_seqs; s++) {
        if (lens[s] < 1 || lens[s] > width * page_size) return s + 1;
        for (int64_t p = 0; p < (lens[s] + page_size - 1) / page_size; p++)
            if (page_table[s * width + p] < 0 || page_table[s * width + p] >= num_pages) return s + 1;
        total += lens[s];
    }
    /* a part: up to `span` keys of one sequence, whole blocks; about DECODE_PARTS_PER_THREAD parts a thread */
    const int64_t want = (int64_t)threads * DECODE_PARTS_PER_THREAD;
    const int64_t span = ((total + want - 1) / want + ATT_BLOCK - 1) / ATT_BLOCK * ATT_BLOCK;
    int64_t *first = malloc(sizeof(int64_t) * (size_t)(num_seqs + 1));
    if (!first) return -1;
    first[0] = 0;  /* sequence s's parts are first[s]..first[s + 1] - 1 */
    for (int64_t s = 0; s < num_seqs; s++) first[s + 1] = first[s] + (lens[s] + span - 1) / span;
    const int64_t group = q_heads / kv_heads, parts = first[num_seqs], stride = q_heads * (dim + 2);
    float *partial = malloc(sizeof(float) * (size_t)(parts * stride + 1));  /* a part's outputs, maxes, sums */
    if (!partial) { free(first); return -1; }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t it = 0; it < parts; it++) {
        int64_t s = 0;
        while (first[s + 1] <= it) s++;
        const int64_t lo = (it - first[s]) * span, hi = lo + span < lens[s] ? lo + span : lens[s];
        const int64_t *pages = page_table + s * width;
        const float *qs = q + q_rows[s] * q_heads * dim;
        float *os = partial + it * stride, *top = os + q_heads * dim, *sum = top + q_heads;
        float qk[q_heads * dim], scores[q_heads * ATT_BLOCK];
        float rows_buf[KEY_GROUP * kv_heads * dim];  /* a group's fp8 rows, decoded */
        const float *kp[KEY_GROUP], *vp[KEY_GROUP];
        /* the key rows' offsets (all kv heads) in k_rows / v_rows: this block's, then the next block's */
        int64_t offsets[2 * ATT_BLOCK], *at = offsets, *next = offsets + ATT_BLOCK;
        for (int64_t x = 0; x < q_heads * dim; x++) qk[x] = qs[x] * (sm_scale * k_scale);
        for (int64_t g = 0; g < q_heads; g++) { top[g] = -INFINITY; sum[g] = 0.0f; }
        memset(os, 0, sizeof(float) * (size_t)(q_heads * dim));
        for (int64_t t = lo; t < hi && t < lo + ATT_BLOCK; t++) {
            next[t - lo] = stored_row(pages, page_size, t) * kv_heads * dim;
            if (t < lo + KEY_AHEAD) prefetch_row(k_rows, format, next[t - lo], kv_heads * dim);
        }
        for (int64_t t0 = lo; t0 < hi; t0 += ATT_BLOCK) {
            const int64_t n = hi - t0 < ATT_BLOCK ? hi - t0 : ATT_BLOCK, t1 = t0 + ATT_BLOCK;
            const int64_t n_next = hi - t1 < 0 ? 0 : hi - t1 < ATT_BLOCK ? hi - t1 : ATT_BLOCK;
            int64_t *swap = at; at = next; next = swap;
            for (int64_t t = t1; t < t1 + n_next; t++)
                next[t - t1] = stored_row(pages, page_size, t) * kv_heads * dim;
            /* fp32 rows key by key, fp8 rows KEY_GROUP at a time (see above) */
#define PREFETCH_READ(POS) prefetch_read(format, k_rows, v_rows, at, next, n, n_next, kv_heads * dim, POS)
            for (int64_t j = 0; j < n && format < 0; j++) {
                PREFETCH_READ(j + KEY_AHEAD);
                for (int64_t h = 0; h < kv_heads; h++) {
                    const float *k = (const float *)k_rows + at[j] + h * dim;
                    for (int64_t g = h * group; g < (h + 1) * group; g++)
                        scores[g * ATT_BLOCK + j] = dot_f32(qk + g * dim, k, dim);
                }
            }
            for (int64_t j0 = 0; j0 < n && format >= 0; j0 += KEY_GROUP) {
                const int64_t m = n - j0 < KEY_GROUP ? n - j0 : KEY_GROUP;
                for (int64_t j = j0; j < j0 + m; j++) {
                    PREFETCH_READ(j + KEY_AHEAD);
                    kv_row(format, k_rows, at[j], kv_heads * dim, rows_buf + (j - j0) * kv_heads * dim);
                }
                for (int64_t h = 0; h < kv_heads; h++) {
                    for (int64_t j = 0; j < KEY_GROUP; j++)  /* keys past m: the first again, not stored */
                        kp[j] = rows_buf + (j < m ? j : 0) * kv_heads * dim + h * dim;
                    qk_keys(group, qk + h * group * dim, dim, kp, m, scores + h * group * ATT_BLOCK + j0,
                            ATT_BLOCK);
                }
            }
            for (int64_t g = 0; g < q_heads; g++) {
                float *sg = scores + g * ATT_BLOCK, block_top = sg[0];
                for (int64_t j = 1; j < n; j++) block_top = sg[j] > block_top ? sg[j] : block_top;
                if (block_top > top[g]) {  /* a new max: what was summed so far shrinks by e^(old - new) */
                    const float shrink = expf(top[g] - block_top);  /* 0 on the first block */
                    sum[g] *= shrink;
                    for (int64_t d = 0; d < dim; d++) os[g * dim + d] *= shrink;
                    top[g] = block_top;
                }
                sum[g] += exp_sum(sg, n, top[g]);
            }
            for (int64_t j = 0; j < n && format < 0; j++) {
                PREFETCH_READ(n + j + KEY_AHEAD);
                for (int64_t h = 0; h < kv_heads; h++) {
                    const float *v = (const float *)v_rows + at[j] + h * dim;
                    for (int64_t g = h * group; g < (h + 1) * group; g++)
                        axpy_f32(scores[g * ATT_BLOCK + j], v, os + g * dim, dim);
                }
            }
            for (int64_t j0 = 0; j0 < n && format >= 0; j0 += KEY_GROUP) {
                const int64_t m = n - j0 < KEY_GROUP ? n - j0 : KEY_GROUP;
                for (int64_t j = j0; j < j0 + m; j++) {
                    PREFETCH_READ(n + j + KEY_AHEAD);
                    kv_row(format, v_rows, at[j], kv_heads * dim, rows_buf + (j - j0) * kv_heads * dim);
                }
                for (int64_t h = 0; h < kv_heads; h++) {
                    for (int64_t j = 0; j < m; j++) vp[j] = rows_buf + j * kv_heads * dim + h * dim;
                    pv_keys(group, scores + h * group * ATT_BLOCK + j0, ATT_BLOCK, vp, m, os + h * group * dim, dim);
                }
            }
        }
    }
    for (int64_t s = 0; s < num_seqs; s++)  /* a sequence's parts merged: each weighed by e^(its max - the max) */
        for (int64_t g = 0; g < q_heads; g++) {
            float m = -INFINITY, total_sum = 0.0f;
            for (int64_t p = first[s]; p < first[s + 1]; p++) {
                const float t = partial[p * stride + q_heads * dim + g];
                m = t > m ? t : m;
            }
            float *o = out + (q_rows[s] * q_heads + g) * dim;
            memset(o, 0, sizeof(float) * (size_t)dim);
            for (int64_t p = first[s]; p < first[s + 1]; p++) {
                const float *part = partial + p * stride;
                const float w = expf(part[q_heads * dim + g] - m);
                total_sum += w * part[q_heads * dim + q_heads + g];
                axpy_f32(w, part + g * dim, o, dim);
            }
            const float norm = v_scale / total_sum;
            for (int64_t d = 0; d < dim; d++) o[d] *= norm;
        }
    free(partial); free(first);
    return 0;
}
#undef PREFETCH_READ

/* Prefill attention over the pages: chunks of many queries (a prompt, or a chunk continuing a cached prefix),
   query i of a chunk at position computed + i seeing keys 0..computed + i, read from the page table, fp32 or fp8
   pages (tensor scale). torch's CPU flash SDPA takes one block of 512 keys for a 512-token prompt, so its causal
   mask saves nothing there (measured on SmolLM2's 9/3 heads, 2 AVX-512 cores: causal 4.65 ms, full 4.56 ms,
   65 GFLOP/s of causal work); here the work is blocked so that a block of keys past a query block's last
   position is never read, and the products are register-tiled.
   First every (chunk, kv head) gets its keys transposed into kt, a [dim][PK_BLOCK] tile per block of keys
   (zeros after the last key; a tile is contiguous, so that the 64 rows a block's products read do not fall on
   a few cache sets, as rows a power of two apart would), and its values copied into vd [keys][dim], fp8
   decoded at scale 1, each stored byte read once.
   Then one work item is PQ_TOKENS query tokens of one kv head: their `group` query heads are its rows (row
   t * group + g: token t, head g), scaled by sm_scale * k_scale. It walks its keys PK_BLOCK at a time, up to its
   last token's position: the block's scores for 6 rows x 16 keys at a time in registers (`qk_tile`), then per
   row the online softmax of flash attention over the keys that row sees (a prefix of the block: the running max,
   the rescale of the sums and outputs when it grows, `exp_sum`), the rest of the row zeroed, then the block's
   values summed into the rows' outputs 6 rows x 16 values at a time (`pv_tile`). The items, the latest query
   blocks (the most keys) first, are shared among `threads` OpenMP threads. Not bit-equal to SDPA (another
   summation order, `exp8`): tested against float64 attention within fp32 rounding.
   q / out [*, q_heads, dim] fp32 (rows num_q_rows); chunk s: rows q_starts[s].. of q_lens[s] queries, computed[s]
   keys before them, pages page_table[s * width ..]. Returns 0; 1 + the first chunk whose rows, length or pages
   are out of range (checked before anything is read or written); -1 when a buffer cannot be allocated. */
#define PQ_TOKENS 16  /* query tokens per work item */
#define PK_BLOCK 64   /* keys per block */
#define TILE_ROWS 6   /* rows of a register tile: 6 x 16 fp32 is 12 of AVX2's 16 registers */
#if defined(__AVX2__) && defined(__FMA__)
/* s[r * lds + c] = Q[r] . kt[:, c] for rows r < R, keys c < ncols (a multiple of 16) */
static inline __attribute__((always_inline)) void qk_tile(int R, const float *Q, int64_t dim, const float *kt,
                                                          int64_t ldk, int64_t ncols, float *s, int64_t lds) {
    for (int64_t c = 0; c < ncols; c += 16) {
        __m256 a0[TILE_ROWS], a1[TILE_ROWS];
        for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_ps();
        for (int64_t d = 0; d < dim; d++) {
            const __m256 b0 = _mm256_loadu_ps(kt + d * ldk + c), b1 = _mm256_loadu_ps(kt + d * ldk + c + 8);
            for (int r = 0; r < R; r++) {
                const __m256 x = _mm256_broadcast_ss(Q + r * dim + d);
                a0[r] = _mm256_fmadd_ps(x, b0, a0[r]);
                a1[r] = _mm256_fmadd_ps(x, b1, a1[r]);
            }
        }
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(s + r * lds + c, a0[r]);
            _mm256_storeu_ps(s + r * lds + c + 8, a1[r]);
        }
    }
}
/* o[r] += sum_j p[r * ldp + j] v[j] for rows r < R over n keys (v rows of dim values, contiguous) */
static inline __attribute__((always_inline)) void pv_tile(int R, const float *p, int64_t ldp, const float *v,
                                                          int64_t n, float *o, int64_t dim) {
    int64_t c = 0;
    for (; c + 16 <= dim; c += 16) {
        __m256 a0[TILE_ROWS], a1[TILE_ROWS];
        for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_ps();
        for (int64_t j = 0; j < n; j++) {
            const __m256 b0 = _mm256_loadu_ps(v + j * dim + c), b1 = _mm256_loadu_ps(v + j * dim + c + 8);
            for (int r = 0; r < R; r++) {
                const __m256 x = _mm256_broadcast_ss(p + r * ldp + j);
                a0[r] = _mm256_fmadd_ps(x, b0, a0[r]);
                a1[r] = _mm256_fmadd_ps(x, b1, a1[r]);
            }
        }
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(o + r * dim + c, _mm256_add_ps(_mm256_loadu_ps(o + r * dim + c), a0[r]));
            _mm256_storeu_ps(o + r * dim + c + 8, _mm256_add_ps(_mm256_loadu_ps(o + r * dim + c + 8), a1[r]));
        }
    }
    if (c < dim)  /* values past the last multiple of 16 */
        for (int r = 0; r < R; r++)
            for (int64_t j = 0; j < n; j++) axpy_f32(p[r * ldp + j], v + j * dim + c, o + r * dim + c, dim - c);
}
static inline float max_f32(const float *s, int64_t n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + j));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    float top = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
    for (; j < n; j++) top = s[j] > top ? s[j] : top;
    return top;
}
#else
static inline void qk_tile(int R, const float *Q, int64_t dim, const float *kt, int64_t ldk, int64_t ncols,
                           float *s, int64_t lds) {
    for (int r = 0; r < R; r++)
        for (int64_t c = 0; c < ncols; c++) {
            float acc = 0.0f;
            for (int64_t d = 0; d < dim; d++) acc += Q[r * dim + d] * kt[d * ldk + c];
            s[r * lds + c] = acc;
        }
}
static inline void pv_tile(int R, const float *p, int64_t ldp, const float *v, int64_t n, float *o, int64_t dim) {
    for (int r = 0; r < R; r++)
        for (int64_t j = 0; j < n; j++) axpy_f32(p[r * ldp + j], v + j * dim, o + r * dim, dim);
}
static inline float max_f32(const float *s, int64_t n) {
    float top = -INFINITY;
    for (int64_t j = 0; j < n; j++) top = s[j] > top ? s[j] : top;
    return top;
}
#endif

/* One work item: tokens t0..t0+nt-1 of a chunk, kv head h (see above). buf: the thread's rows (qs, s, o, top,
   sum) for PQ_TOKENS * group rows. */
static void prefill_item(const float *q, int64_t q_heads, int64_t group, int64_t dim, int64_t h, int64_t q_start,
                         int64_t computed, int64_t t0, int64_t nt, const float *kt, const float *vd,
                         float q_scale, float v_scale, float *out, float *buf) {
    const int64_t M = nt * group, rows = PQ_TOKENS * group;
    float *qs = buf, *s = qs + rows * dim, *o = s + rows * PK_BLOCK, *top = o + rows * dim, *sum = top + rows;
    for (int64_t t = 0; t < nt; t++)
        for (int64_t x = 0; x < group * dim; x++)  /* the group's heads are adjacent in a token's row */
            qs[t * group * dim + x] = q[((q_start + t0 + t) * q_heads + h * group) * dim + x] * q_scale;
    memset(o, 0, sizeof(float) * (size_t)(M * dim));
    for (int64_t r = 0; r < M; r++) { top[r] = -INFINITY; sum[r] = 0.0f; }
    const int64_t kend = computed + t0 + nt;  /* keys the item's last token sees */
    for (int64_t j0 = 0; j0 < kend; j0 += PK_BLOCK) {
        const int64_t n = kend - j0 < PK_BLOCK ? kend - j0 : PK_BLOCK, ncols = (n + 15) & ~(int64_t)15;
        const float *tile = kt + j0 * dim;  /* the block's [dim][PK_BLOCK] */
        TILED(M, TILE_ROWS,
              qk_tile(TILE_ROWS, qs + r0 * dim, dim, tile, PK_BLOCK, ncols, s + r0 * PK_BLOCK, PK_BLOCK),
              qk_tile((int)(M - r0), qs + r0 * dim, dim, tile, PK_BLOCK, ncols, s + r0 * PK_BLOCK, PK_BLOCK));
        for (int64_t r = 0; r < M; r++) {
            float *sr = s + r * PK_BLOCK;
            int64_t seen = computed + t0 + r / group - j0 + 1;  /* the row's keys in this block: a prefix */
            seen = seen > n ? n : (seen < 0 ? 0 : seen);
            if (seen) {
                const float block_top = max_f32(sr, seen);
                if (block_top > top[r]) {  /* a new max: what was summed so far shrinks by e^(old - new) */
                    const float shrink = expf(top[r] - block_top);  /* 0 on the row's first block */
                    sum[r] *= shrink;
                    for (int64_t d = 0; d < dim; d++) o[r * dim + d] *= shrink;
                    top[r] = block_top;
                }
                sum[r] += exp_sum(sr, seen, top[r]);
            }
            memset(sr + seen, 0, sizeof(float) * (size_t)(n - seen));
        }
        const float *vb = vd + j0 * dim;
        TILED(M, TILE_ROWS, pv_tile(TILE_ROWS, s + r0 * PK_BLOCK, PK_BLOCK, vb, n, o + r0 * dim, dim),
              pv_tile((int)(M - r0), s + r0 * PK_BLOCK, PK_BLOCK, vb, n, o + r0 * dim, dim));
    }
    for (int64_t r = 0; r < M; r++) {
        const int64_t t = r / group, g = r % group;
        const float norm = v_scale / sum[r];
        float *dst = out + ((q_start + t0 + t) * q_heads + h * group + g) * dim;
        for (int64_t d = 0; d < dim; d++) dst[d] = o[r * dim + d] * norm;
    }
}

/* Keys rounded up to whole blocks: a chunk's kt holds this many columns. */
static inline int64_t keys_padded(int64_t total) { return (total + PK_BLOCK - 1) / PK_BLOCK * PK_BLOCK; }

/* Chunk s's kt for kv head h in the scratch `kv` (its vd follows it, dim * keys_padded(total) later). */
static inline float *chunk_keys(float *kv, const int64_t *base, int64_t s, int64_t h, int64_t total, int64_t dim) {
    return kv + base[s] + h * dim * (keys_padded(total) + total);
}

int64_t kv_prefill_attention(int format, const void *k_rows, const void *v_rows, int64_t num_pages,
                             int64_t page_size, int64_t kv_heads, int64_t dim, float k_scale, float v_scale,
                             const float *q, int64_t num_q_rows, int64_t q_heads, int64_t num_seqs,
                             const int64_t *q_starts, const int64_t *q_lens, const int64_t *computed,
                             const int64_t *page_table, int64_t width, float sm_scale, float *out, int threads) {
    const size_t offsets = sizeof(int64_t) * (size_t)(num_seqs + 1);
    int64_t *base = malloc(offsets), *first = malloc(offsets);
    if (!base || !first) { free(base); free(first); return -1; }
    base[0] = first[0] = 0;  /* chunk s's kt / vd at base[s]; its work items from first[s] */
    for (int64_t s = 0; s < num_seqs; s++) {
        const int64_t total = computed[s] + q_lens[s];
        if (q_lens[s] < 1 || computed[s] < 0 || q_starts[s] < 0 || q_starts[s] + q_lens[s] > num_q_rows
                || total > width * page_size) { free(base); free(first); return s + 1; }
        for (int64_t p = 0; p < (total + page_size - 1) / page_size; p++)
            if (page_table[s * width + p] < 0 || page_table[s * width + p] >= num_pages) {
                free(base); free(first); return s + 1;
            }
        base[s + 1] = base[s] + kv_heads * dim * (keys_padded(total) + total);
        first[s + 1] = first[s] + kv_heads * ((q_lens[s] + PQ_TOKENS - 1) / PQ_TOKENS);
    }
    const int64_t group = q_heads / kv_heads, pairs = num_seqs * kv_heads, items = first[num_seqs];
    float *kv = malloc(sizeof(float) * (size_t)(base[num_seqs] ? base[num_seqs] : 1));
    if (!kv) { free(base); free(first); return -1; }
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        const int64_t rows = PQ_TOKENS * group;
        float *buf = malloc(sizeof(float) * (size_t)(rows * (2 * dim + PK_BLOCK + 2) + dim));
        float *row = buf ? buf + rows * (2 * dim + PK_BLOCK + 2) : NULL;  /* a decoded fp8 row */
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < pairs; it++) {  /* chunk s, kv head h: its keys transposed, its values copied */
            const int64_t s = it / kv_heads, h = it % kv_heads, total = computed[s] + q_lens[s];
            float *kt = chunk_keys(kv, base, s, h, total, dim), *vd = kt + dim * keys_padded(total);
            if (!buf) continue;
            for (int64_t t = 0; t < keys_padded(total); t++) {
                float *col = kt + (t / PK_BLOCK) * PK_BLOCK * dim + t % PK_BLOCK;  /* key t in its block's tile */
                if (t >= total) {  /* past the last key: zeros */
                    for (int64_t d = 0; d < dim; d++) col[d * PK_BLOCK] = 0.0f;
                    continue;
                }
                const int64_t at = (stored_row(page_table + s * width, page_size, t) * kv_heads + h) * dim;
                const float *k = kv_row(format, k_rows, at, dim, row);
                for (int64_t d = 0; d < dim; d++) col[d * PK_BLOCK] = k[d];
                memcpy(vd + t * dim, kv_row(format, v_rows, at, dim, row), sizeof(float) * (size_t)dim);
            }
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            int64_t s = 0;
            while (first[s + 1] <= it) s++;
            const int64_t blocks = (q_lens[s] + PQ_TOKENS - 1) / PQ_TOKENS, local = it - first[s];
            const int64_t b = blocks - 1 - local / kv_heads, h = local % kv_heads;  /* the latest blocks first */
            const int64_t t0 = b * PQ_TOKENS, nt = q_lens[s] - t0 < PQ_TOKENS ? q_lens[s] - t0 : PQ_TOKENS;
            const int64_t total = computed[s] + q_lens[s];
            const float *kt = chunk_keys(kv, base, s, h, total, dim);
            if (buf && !failed)
                prefill_item(q, q_heads, group, dim, h, q_starts[s], computed[s], t0, nt, kt,
                             kt + dim * keys_padded(total),
                             sm_scale * k_scale, v_scale, out, buf);
        }
        free(buf);
    }
    free(kv); free(base); free(first);
    return failed ? -1 : 0;
}

/* A linear layer for the few rows of a decode step: y[m, n] = x[m, :] . w[n, :] (+ bias[n]), w row-major
   [n_out, k] (torch's nn.Linear layout, not repacked). At a handful of rows the step is bound by reading the
   weights, so each weight byte is read from memory once: the `threads` OpenMP threads each stream their own
   contiguous block of output rows, four at a time, and every row of x is multiplied with those four weight rows
   while they sit in L1 (x's rows, a few KiB each, stay in cache). While it reads a block of four rows it asks for
   the thread's next block (`_mm_prefetch`). Measured at 2 rows on 2 AVX-512 cores, GB/s of weights, two rounds
   each (`benchmarks/linear_rows.py`): qkv 11.5 / 10.8 -> 12.9 / 12.6, o_proj 8.9 / 8.7 -> 10.8 / 10.3, down
   14.6 / 12.8 -> 15.9 / 16.8; at 1 row within noise. Sums in 8 fp32 lanes, then across them: not bit-equal to
   torch's matmul (another summation order), tested against it within fp32 rounding.
   Returns 0; 1 where this build has no AVX2+FMA path (the caller keeps torch's). */
#if defined(__AVX2__) && defined(__FMA__)
/* Output rows n0..n0+3 (all four exist) for x rows r and r+1 (`two`: whether r+1 is one), k a multiple of 8. */
static inline void rows4(const float *x, int64_t r, int two, int64_t k, const float *w, int64_t n0,
                         const float *bias, float *y, int64_t n_out, int prefetch) {
    const float *w0 = w + n0 * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
    const float *xa = x + r * k, *xb = two ? xa + k : xa;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t i = 0; i < k; i += 8) {
        if (prefetch && (i & 15) == 0) {  /* the next block's rows, a block ahead of the loads */
            _mm_prefetch((const char *)(w0 + 4 * k + i), _MM_HINT_T0);
            _mm_prefetch((const char *)(w1 + 4 * k + i), _MM_HINT_T0);
            _mm_prefetch((const char *)(w2 + 4 * k + i), _MM_HINT_T0);
            _mm_prefetch((const char *)(w3 + 4 * k + i), _MM_HINT_T0);
        }
        const __m256 v0 = _mm256_loadu_ps(w0 + i), v1 = _mm256_loadu_ps(w1 + i);
        const __m256 v2 = _mm256_loadu_ps(w2 + i), v3 = _mm256_loadu_ps(w3 + i);
        const __m256 p = _mm256_loadu_ps(xa + i);
        a0 = _mm256_fmadd_ps(v0, p, a0); a1 = _mm256_fmadd_ps(v1, p, a1);
        a2 = _mm256_fmadd_ps(v2, p, a2); a3 = _mm256_fmadd_ps(v3, p, a3);
        if (two) {
            const __m256 q = _mm256_loadu_ps(xb + i);
            b0 = _mm256_fmadd_ps(v0, q, b0); b1 = _mm256_fmadd_ps(v1, q, b1);
            b2 = _mm256_fmadd_ps(v2, q, b2); b3 = _mm256_fmadd_ps(v3, q, b3);
        }
    }
    const float c0 = bias ? bias[n0] : 0.0f, c1 = bias ? bias[n0 + 1] : 0.0f;
    const float c2 = bias ? bias[n0 + 2] : 0.0f, c3 = bias ? bias[n0 + 3] : 0.0f;
    float *ya = y + r * n_out + n0;
    ya[0] = hsum8(a0) + c0; ya[1] = hsum8(a1) + c1; ya[2] = hsum8(a2) + c2; ya[3] = hsum8(a3) + c3;
    if (two) {
        float *yb = ya + n_out;
        yb[0] = hsum8(b0) + c0; yb[1] = hsum8(b1) + c1; yb[2] = hsum8(b2) + c2; yb[3] = hsum8(b3) + c3;
    }
}

/* One output row n for every x row (the tail past a multiple of four), k a multiple of 8. */
static inline void row1(const float *x, int64_t m, int64_t k, const float *w, int64_t n, const float *bias,
                        float *y, int64_t n_out) {
    for (int64_t r = 0; r < m; r++) y[r * n_out + n] = dot_f32(x + r * k, w + n * k, k) + (bias ? bias[n] : 0.0f);
}

int64_t linear_rows(const float *x, int64_t m, int64_t k, const float *w, int64_t n_out, const float *bias,
                    float *y, int threads) {
    if (k % 8) return 1;
    const int64_t blocks = n_out / 4;
#pragma omp parallel num_threads(threads)
    {
        int nt = 1, t = 0;
#ifdef _OPENMP
        nt = omp_get_num_threads();
        t = omp_get_thread_num();
#endif
        const int64_t lo = blocks * t / nt, hi = blocks * (t + 1) / nt;
        for (int64_t b = lo; b < hi; b++)
            for (int64_t r = 0; r < m; r += 2)  /* the first pass over a block prefetches the next one's rows */
                rows4(x, r, r + 1 < m, k, w, 4 * b, bias, y, n_out, r == 0 && b + 1 < hi);
        if (t == nt - 1)
            for (int64_t n = 4 * blocks; n < n_out; n++) row1(x, m, k, w, n, bias, y, n_out);
    }
    return 0;
}
#else
int64_t linear_rows(const float *x, int64_t m, int64_t k, const float *w, int64_t n_out, const float *bias,
                    float *y, int threads) {
    return 1;
}
#endif

/* Rotary embedding, halves layout (Hugging Face's `rotate_half`): row t's heads x [t * stride ..] of dim values,
   x1 its first half, x2 its second, cos / sin [n, dim] -> out [n, heads, dim] contiguous:
   out1 = x1 * cos1 + (-x2) * sin1, out2 = x2 * cos2 + x1 * sin2: torch's `x * cos + rotate_half(x) * sin`
   operation for operation (built without contraction: no multiply-add is fused), so bit-equal to it, in one pass
   instead of five tensor operations. Threads over rows where there are enough of them. */
int64_t rope(const float *x, int64_t n, int64_t stride, int64_t heads, int64_t dim, const float *cos,
             const float *sin, float *out, int threads) {
    if (dim % 2) return 1;
    const int64_t half = dim / 2;
#pragma omp parallel for num_threads(threads) if (n * heads >= 256)
    for (int64_t t = 0; t < n; t++) {
        const float *c = cos + t * dim, *s = sin + t * dim;
        for (int64_t h = 0; h < heads; h++) {
            const float *x1 = x + t * stride + h * dim, *x2 = x1 + half;
            float *o1 = out + (t * heads + h) * dim, *o2 = o1 + half;
            for (int64_t i = 0; i < half; i++) {
                const float a = x1[i] * c[i], b = -x2[i] * s[i];
                const float e = x2[i] * c[half + i], f = x1[i] * s[half + i];
                o1[i] = a + b;
                o2[i] = e + f;
            }
        }
    }
    return 0;
}

/* The MLP's activation: rows x [n][2 * width] of the fused gate-up output (gate, then up) -> out [n][width] =
   silu(gate) * up = gate / (1 + e^-gate) * up, in one pass instead of torch's two (F.silu, then the product,
   each a pass over the rows and a new tensor). e^x is `exp8` (within 2 ulp of expf) on 8 lanes, expf for the
   rest: not bit-equal to torch's (Sleef's e^x), tested within fp32 rounding of it. Threads over rows where
   there are enough of them. */
int64_t silu_mul(const float *x, int64_t n, int64_t width, float *out, int threads) {
#pragma omp parallel for num_threads(threads) if (n * width >= 65536)
    for (int64_t t = 0; t < n; t++) {
        const float *g = x + t * 2 * width, *u = g + width;
        float *o = out + t * width;
        int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
        const __m256 one = _mm256_set1_ps(1.0f);
        for (; i + 8 <= width; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i);
            /* e^-g at most e^88 (exp8 keeps to the float range only from below): a gate under -88 gives
               -88 / e^88 ~ -5e-37 where torch gives -0 */
            const __m256 e = exp8(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), gv), _mm256_set1_ps(88.0f)));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < width; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
    return 0;
}
