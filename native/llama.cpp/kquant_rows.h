// SpecLens's small-batch kernels for llama.cpp's repacked Q4_K and Q6_K weights (included by ggml-cpu/repack.cpp;
// native/llama.cpp/README.md says why). A verification call multiplies each weight matrix by 2-16 activation rows.
// Stock llama.cpp 0.3.36 (ggml 0.25.3) runs such a batch of Q4_K rows one by one below 4 rows and with an AVX2
// kernel below 16 (its AVX-512 path takes 16 rows at a time), and Q6_K rows one by one on x86, so each extra row cost
// about 0.85 of a single row on a 2-core Zen 4. These kernels read each block of 8 weight columns once, unpack it
// once, and run every row against it with AVX-512 VNNI (`vpdpbusd`: unsigned codes times the signed Q8_K activations;
// an AVX2 variant below does the same with vpmaddubsw).
// The arithmetic is the stock kernels': exact integer dot products per sub-block, times the sub-block scales, then the
// fp16 super-block scales in float; only the order of the float additions differs (as between stock gemv and gemm).
#pragma once

#include <type_traits>

#if (defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)) || \
    (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#define SPECLENS_KQUANT_ROWS 1
#include <immintrin.h>

namespace speclens {

// The weights stream from memory, one block after the other (a matrix's blocks of 8 columns are contiguous too), and
// at one or two rows the hardware prefetcher alone left the kernels waiting on memory (half the Q6_K kernel's time at
// one row on a Zen 4): each block asks for the bytes prefetch_distance ahead into L2, a cache line at a time (16, 48
// and 96 KB measured alike there).
static constexpr size_t prefetch_distance = 16 * 1024;
template <typename BLOCK>
static inline void prefetch_ahead(const BLOCK * block) {
    const char * ahead = (const char *) block + prefetch_distance;
    for (size_t line = 0; line < sizeof(BLOCK); line += 64) {
        _mm_prefetch(ahead + line, _MM_HINT_T1);
    }
}

// The six-bit scales and mins of one super-block's sub-blocks, per column: scale[sb][j], min[sb][j] (unpacked as
// ggml_gemv_q4_K_8x8_q8_K_generic does).
static inline void q4_K_scales_mins(const uint8_t * packed, uint8_t scale[8][8], uint8_t min[8][8]) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    for (int sb = 0; sb < 8; sb++) {
        uint32_t u[4];
        memcpy(u, packed + sb * 12, 12);
        u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
        const uint32_t hi = u[1] & kmask1;
        u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
        u[2] = hi;
        u[0] &= kmask1;
        memcpy(scale[sb], u, 8);
        memcpy(min[sb], (const uint8_t *) u + 8, 8);
    }
}

// The mins of sub-blocks 2i and 2i+1 of one Q4_K super-block as int16 pairs per column (8 columns), to multiply
// against pairs of a row's block sums.
static inline void q4_K_min_pairs(const uint8_t min[8][8], __m256i pairs[4]) {
    for (int i = 0; i < 4; i++) {
        const __m128i lo = _mm_loadl_epi64((const __m128i *) min[2 * i]);
        const __m128i hi = _mm_loadl_epi64((const __m128i *) min[2 * i + 1]);
        pairs[i] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(lo, hi));
    }
}

// min_acc + per column: dmin * x.d * the sum over sub-blocks of min * (row x's sum of that sub-block's 32 values).
static inline __m256 q4_K_add_mins(__m256 min_acc, const __m256i pairs[4], __m256 dmin, const block_q8_K & x) {
    __m256i sums = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        // sums of 32 values fit int16 (|sum| <= 32 * 128)
        const uint32_t pair = (uint16_t) (x.bsums[4 * i] + x.bsums[4 * i + 1]) |
                              ((uint32_t) (uint16_t) (x.bsums[4 * i + 2] + x.bsums[4 * i + 3]) << 16);
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(pairs[i], _mm256_set1_epi32((int32_t) pair)));
    }
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(dmin, _mm256_set1_ps(x.d)), min_acc);
}

// The int8 scales of Q6_K groups 2t and 2t+1 (16 values each) as int16 pairs per column (8 columns).
static inline void q6_K_scale_pairs(const int8_t * scales, __m256i pairs[8]) {
    for (int t = 0; t < 8; t++) {
        const __m128i lo = _mm_loadl_epi64((const __m128i *) (scales + 16 * t));
        const __m128i hi = _mm_loadl_epi64((const __m128i *) (scales + 16 * t + 8));
        pairs[t] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(lo, hi));
    }
}

// offset_acc + per column: 32 * d * x.d * the sum over groups of scale * (row x's sum of that group's 16 values),
// what the codes' offset of 32 takes off.
static inline __m256 q6_K_add_offsets(__m256 offset_acc, const __m256i pairs[8], __m256 d, const block_q8_K & x) {
    __m256i sums = _mm256_setzero_si256();
    for (int t = 0; t < 8; t++) {
        const uint32_t pair = (uint16_t) x.bsums[2 * t] | ((uint32_t) (uint16_t) x.bsums[2 * t + 1] << 16);
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(pairs[t], _mm256_set1_epi32((int32_t) pair)));
    }
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(d, _mm256_set1_ps(32.0f * x.d)), offset_acc);
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

// (c0 .. c7) -> (c0, c0, c1, c1, .. c7, c7): one value per lane of a 16-lane sum, whose lanes 2j and 2j+1 are column j
static inline __m512 column_pairs(__m256 columns) {
    const __m512i twice = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    return _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(columns));
}

// Lanes 2j and 2j+1 of a 16-lane sum hold column j (eight bytes of it, four per lane): out[j] = their sum - less[j].
static inline void store_columns(float * out, __m512 pairs, __m256 less) {
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512 columns = _mm512_add_ps(_mm512_permutexvar_ps(even, pairs), _mm512_permutexvar_ps(odd, pairs));
    _mm256_storeu_ps(out, _mm256_sub_ps(_mm512_castps512_ps256(columns), less));
}

// ROWS activation rows (ROWS <= 4, so that the unpacked weights, the rows' sums and their accumulators stay in the 32
// vector registers) against one block of 8 weight columns, over the nb super-blocks of a row.
template <int ROWS>
static void q4_K_rows_block(int nb, float * s, size_t bs, const block_q4_Kx8 * w, const block_q8_K * a) {
    const __m512i low_nibble = _mm512_set1_epi8(0x0F);
    __m512 acc[ROWS];
    __m256 min_acc[ROWS];
    for (int m = 0; m < ROWS; m++) {
        acc[m] = _mm512_setzero_ps();
        min_acc[m] = _mm256_setzero_ps();
    }
    for (int l = 0; l < nb; l++) {
        prefetch_ahead(&w[l]);
        uint8_t sc[8][8], mn[8][8];
        q4_K_scales_mins(w[l].scales, sc, mn);
        __m512i scale[8];
        for (int sb = 0; sb < 8; sb++) {
            const __m128i b = _mm_loadl_epi64((const __m128i *) sc[sb]);
            scale[sb] = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
        }
        __m256i mins[4];
        q4_K_min_pairs(mn, mins);
        __m512i isum[ROWS];
        for (int m = 0; m < ROWS; m++) {
            isum[m] = _mm512_setzero_si512();
        }
        // 64 values at a time: qs[(4c + k) * 64 + 8j + i] holds value 8k + i of sub-block 2c (low nibble) and of
        // sub-block 2c + 1 (high nibble) of column j
        for (int c = 0; c < 4; c++) {
            __m512i lo[4], hi[4];
            for (int k = 0; k < 4; k++) {
                const __m512i q = _mm512_loadu_si512((const void *) (w[l].qs + (c * 4 + k) * 64));
                lo[k] = _mm512_and_si512(q, low_nibble);
                hi[k] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low_nibble);
            }
            for (int m = 0; m < ROWS; m++) {
                const int8_t * x = a[(size_t) m * nb + l].qs + c * 64;
                __m512i sum_lo = _mm512_setzero_si512(), sum_hi = _mm512_setzero_si512();
                for (int k = 0; k < 4; k++) {
                    int64_t x_lo, x_hi;
                    memcpy(&x_lo, x + k * 8, 8);
                    memcpy(&x_hi, x + 32 + k * 8, 8);
                    sum_lo = _mm512_dpbusd_epi32(sum_lo, lo[k], _mm512_set1_epi64(x_lo));
                    sum_hi = _mm512_dpbusd_epi32(sum_hi, hi[k], _mm512_set1_epi64(x_hi));
                }
                isum[m] = _mm512_add_epi32(isum[m], _mm512_mullo_epi32(sum_lo, scale[2 * c]));
                isum[m] = _mm512_add_epi32(isum[m], _mm512_mullo_epi32(sum_hi, scale[2 * c + 1]));
            }
        }
        const __m512 d = column_pairs(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w[l].d)));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w[l].dmin));
        for (int m = 0; m < ROWS; m++) {
            const block_q8_K & x = a[(size_t) m * nb + l];
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m]), _mm512_mul_ps(d, _mm512_set1_ps(x.d)), acc[m]);
            min_acc[m] = q4_K_add_mins(min_acc[m], mins, dmin, x);
        }
    }
    for (int m = 0; m < ROWS; m++) {
        store_columns(s + (size_t) m * bs, acc[m], min_acc[m]);
    }
}

// ROWS activation rows against one block of 8 weight columns repacked as block_q6_Kx8 (make_block_q6_Kx8: ql, qh
// and the scales interleaved 8 bytes, or one byte, per column). A value is (6 bits) - 32 times an int8 scale per 16
// values: the 6-bit codes go through vpdpbusd unsigned, and the 32 comes off once per 16 values, from the rows'
// block sums.
template <int ROWS>
static void q6_K_rows_block(int nb, float * s, size_t bs, const block_q6_Kx8 * w, const block_q8_K * a) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i m2 = _mm512_set1_epi8(0x03);
    __m512 acc[ROWS];
    __m256 offset_acc[ROWS];
    for (int m = 0; m < ROWS; m++) {
        acc[m] = _mm512_setzero_ps();
        offset_acc[m] = _mm256_setzero_ps();
    }
    for (int l = 0; l < nb; l++) {
        const block_q6_Kx8 & b = w[l];
        prefetch_ahead(&b);
        __m256i scale_pairs[8];
        q6_K_scale_pairs(b.scales, scale_pairs);
        __m512i isum[ROWS];
        for (int m = 0; m < ROWS; m++) {
            isum[m] = _mm512_setzero_si512();
        }
        // half h of the super-block (128 values), quarter q of each of its four runs of 32: values
        // h*128 + 32r + 16q + i (r = 0..3, i = 0..15) come from ql chunks h*8 + 2q + {0, 1} (r = 0, 2: low and
        // high nibbles) and h*8 + 4 + 2q + {0, 1} (r = 1, 3), their top two bits from qh chunk h*4 + 2q + {0, 1}
        for (int h = 0; h < 2; h++) {
            for (int q = 0; q < 2; q++) {
                __m512i v[4][2];
                for (int p = 0; p < 2; p++) {
                    const int p4 = 2 * q + p;
                    const __m512i qa = _mm512_loadu_si512((const void *) (b.ql + (h * 8 + p4) * 64));
                    const __m512i qb = _mm512_loadu_si512((const void *) (b.ql + (h * 8 + 4 + p4) * 64));
                    const __m512i qh = _mm512_loadu_si512((const void *) (b.qh + (h * 4 + p4) * 64));
                    v[0][p] = _mm512_or_si512(_mm512_and_si512(qa, m4),
                                              _mm512_slli_epi16(_mm512_and_si512(qh, m2), 4));
                    v[1][p] = _mm512_or_si512(_mm512_and_si512(qb, m4),
                                              _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 2), m2), 4));
                    v[2][p] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(qa, 4), m4),
                                              _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 4), m2), 4));
                    v[3][p] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(qb, 4), m4),
                                              _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 6), m2), 4));
                }
                __m512i scale[4];
                for (int r = 0; r < 4; r++) {
                    const __m128i g = _mm_loadl_epi64((const __m128i *) (b.scales + (h * 8 + 2 * r + q) * 8));
                    scale[r] = _mm512_cvtepi8_epi32(_mm_unpacklo_epi8(g, g));
                }
                for (int m = 0; m < ROWS; m++) {
                    const int8_t * x = a[(size_t) m * nb + l].qs + h * 128 + 16 * q;
                    for (int r = 0; r < 4; r++) {
                        int64_t x0, x1;
                        memcpy(&x0, x + 32 * r, 8);
                        memcpy(&x1, x + 32 * r + 8, 8);
                        __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[r][0], _mm512_set1_epi64(x0));
                        sum = _mm512_dpbusd_epi32(sum, v[r][1], _mm512_set1_epi64(x1));
                        isum[m] = _mm512_add_epi32(isum[m], _mm512_mullo_epi32(sum, scale[r]));
                    }
                }
            }
        }
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) b.d));
        const __m512 d = column_pairs(d8);
        for (int m = 0; m < ROWS; m++) {
            const block_q8_K & x = a[(size_t) m * nb + l];
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m]), _mm512_mul_ps(d, _mm512_set1_ps(x.d)), acc[m]);
            offset_acc[m] = q6_K_add_offsets(offset_acc[m], scale_pairs, d8, x);
        }
    }
    for (int m = 0; m < ROWS; m++) {
        store_columns(s + (size_t) m * bs, acc[m], offset_acc[m]);
    }
}

#else

// Without VNNI (an AVX2 CPU such as a Zen 3) the same kernels run 4 columns at a time in 256-bit registers, and
// vpmaddubsw does the products: it sums pairs into int16, which holds the four products of a Q4_K sub-block's 8-value
// runs (4 * 2 * 15 * 127) and two of a Q6_K group's (2 * 2 * 63 * 127), so one vpmaddwd per sub-block applies the
// scale and widens to int32.

// bytes b0 .. b3 of a column's scale -> int16 lanes (b0 x4, b1 x4, b2 x4, b3 x4): the four products a column's 8
// bytes make in vpmaddubsw
static inline __m256i column_scales(const void * four_bytes, bool is_signed) {
    const __m128i spread = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    int32_t b;
    memcpy(&b, four_bytes, 4);
    const __m128i bytes = _mm_shuffle_epi8(_mm_cvtsi32_si128(b), spread);
    return is_signed ? _mm256_cvtepi8_epi16(bytes) : _mm256_cvtepu8_epi16(bytes);
}

// 8 fp32 lanes (2 per column) of the 4 columns of half h: (d[4h], d[4h], d[4h + 1], ..)
static inline __m256 half_pairs(__m256 d8, int h) {
    return _mm256_permutevar8x32_ps(d8, _mm256_add_epi32(_mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3),
                                                         _mm256_set1_epi32(4 * h)));
}

// Lanes 2j and 2j+1 of half h's sum hold column 4h + j: out[c] = their sum - less[c].
static inline void store_columns(float * out, const __m256 halves[2], __m256 less) {
    const __m256 sums = _mm256_hadd_ps(halves[0], halves[1]);   // c0 c1 c4 c5 | c2 c3 c6 c7
    const __m256 columns = _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
    _mm256_storeu_ps(out, _mm256_sub_ps(columns, less));
}

template <int ROWS>
static void q4_K_rows_block(int nb, float * s, size_t bs, const block_q4_Kx8 * w, const block_q8_K * a) {
    const __m256i low_nibble = _mm256_set1_epi8(0x0F);
    __m256 acc[ROWS][2];
    __m256 min_acc[ROWS];
    for (int m = 0; m < ROWS; m++) {
        acc[m][0] = acc[m][1] = min_acc[m] = _mm256_setzero_ps();
    }
    for (int l = 0; l < nb; l++) {
        prefetch_ahead(&w[l]);
        uint8_t sc[8][8], mn[8][8];
        q4_K_scales_mins(w[l].scales, sc, mn);
        __m256i mins[4];
        q4_K_min_pairs(mn, mins);
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w[l].d));
        for (int h = 0; h < 2; h++) {
            __m256i isum[ROWS];
            for (int m = 0; m < ROWS; m++) {
                isum[m] = _mm256_setzero_si256();
            }
            for (int c = 0; c < 4; c++) {
                __m256i lo[4], hi[4];
                for (int k = 0; k < 4; k++) {
                    const __m256i q = _mm256_loadu_si256((const __m256i *) (w[l].qs + (c * 4 + k) * 64 + 32 * h));
                    lo[k] = _mm256_and_si256(q, low_nibble);
                    hi[k] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low_nibble);
                }
                const __m256i scale_lo = column_scales(sc[2 * c] + 4 * h, false);
                const __m256i scale_hi = column_scales(sc[2 * c + 1] + 4 * h, false);
                for (int m = 0; m < ROWS; m++) {
                    const int8_t * x = a[(size_t) m * nb + l].qs + c * 64;
                    __m256i sum_lo = _mm256_setzero_si256(), sum_hi = _mm256_setzero_si256();
                    for (int k = 0; k < 4; k++) {
                        int64_t x_lo, x_hi;
                        memcpy(&x_lo, x + k * 8, 8);
                        memcpy(&x_hi, x + 32 + k * 8, 8);
                        sum_lo = _mm256_add_epi16(sum_lo, _mm256_maddubs_epi16(lo[k], _mm256_set1_epi64x(x_lo)));
                        sum_hi = _mm256_add_epi16(sum_hi, _mm256_maddubs_epi16(hi[k], _mm256_set1_epi64x(x_hi)));
                    }
                    isum[m] = _mm256_add_epi32(isum[m], _mm256_madd_epi16(sum_lo, scale_lo));
                    isum[m] = _mm256_add_epi32(isum[m], _mm256_madd_epi16(sum_hi, scale_hi));
                }
            }
            const __m256 d = half_pairs(d8, h);
            for (int m = 0; m < ROWS; m++) {
                const float xd = a[(size_t) m * nb + l].d;
                acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[m]), _mm256_mul_ps(d, _mm256_set1_ps(xd)),
                                            acc[m][h]);
            }
        }
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) w[l].dmin));
        for (int m = 0; m < ROWS; m++) {
            const block_q8_K & x = a[(size_t) m * nb + l];
            min_acc[m] = q4_K_add_mins(min_acc[m], mins, dmin, x);
        }
    }
    for (int m = 0; m < ROWS; m++) {
        store_columns(s + (size_t) m * bs, acc[m], min_acc[m]);
    }
}

template <int ROWS>
static void q6_K_rows_block(int nb, float * s, size_t bs, const block_q6_Kx8 * w, const block_q8_K * a) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m2 = _mm256_set1_epi8(0x03);
    __m256 acc[ROWS][2];
    __m256 offset_acc[ROWS];
    for (int m = 0; m < ROWS; m++) {
        acc[m][0] = acc[m][1] = offset_acc[m] = _mm256_setzero_ps();
    }
    for (int l = 0; l < nb; l++) {
        const block_q6_Kx8 & b = w[l];
        prefetch_ahead(&b);
        __m256i scale_pairs[8];
        q6_K_scale_pairs(b.scales, scale_pairs);
        const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) b.d));
        for (int half = 0; half < 2; half++) {
            __m256i isum[ROWS];
            for (int m = 0; m < ROWS; m++) {
                isum[m] = _mm256_setzero_si256();
            }
            // as in the AVX-512 kernel: half h of the super-block, quarter q of each run of 32
            for (int h = 0; h < 2; h++) {
                for (int q = 0; q < 2; q++) {
                    __m256i v[4][2];
                    for (int p = 0; p < 2; p++) {
                        const int p4 = 2 * q + p;
                        const uint8_t * ql = b.ql + 32 * half;
                        const __m256i qa = _mm256_loadu_si256((const __m256i *) (ql + (h * 8 + p4) * 64));
                        const __m256i qb = _mm256_loadu_si256((const __m256i *) (ql + (h * 8 + 4 + p4) * 64));
                        const __m256i qh = _mm256_loadu_si256((const __m256i *) (b.qh + (h * 4 + p4) * 64 + 32 * half));
                        v[0][p] = _mm256_or_si256(_mm256_and_si256(qa, m4),
                                                  _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
                        v[1][p] = _mm256_or_si256(_mm256_and_si256(qb, m4),
                                                  _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
                        v[2][p] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4),
                                                  _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
                        v[3][p] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
                                                  _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
                    }
                    __m256i scale[4];
                    for (int r = 0; r < 4; r++) {
                        scale[r] = column_scales(b.scales + (h * 8 + 2 * r + q) * 8 + 4 * half, true);
                    }
                    for (int m = 0; m < ROWS; m++) {
                        const int8_t * x = a[(size_t) m * nb + l].qs + h * 128 + 16 * q;
                        for (int r = 0; r < 4; r++) {
                            int64_t x0, x1;
                            memcpy(&x0, x + 32 * r, 8);
                            memcpy(&x1, x + 32 * r + 8, 8);
                            const __m256i sum = _mm256_add_epi16(_mm256_maddubs_epi16(v[r][0], _mm256_set1_epi64x(x0)),
                                                                 _mm256_maddubs_epi16(v[r][1], _mm256_set1_epi64x(x1)));
                            isum[m] = _mm256_add_epi32(isum[m], _mm256_madd_epi16(sum, scale[r]));
                        }
                    }
                }
            }
            const __m256 d = half_pairs(d8, half);
            for (int m = 0; m < ROWS; m++) {
                const float xd = a[(size_t) m * nb + l].d;
                acc[m][half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[m]), _mm256_mul_ps(d, _mm256_set1_ps(xd)),
                                               acc[m][half]);
            }
        }
        for (int m = 0; m < ROWS; m++) {
            const block_q8_K & x = a[(size_t) m * nb + l];
            offset_acc[m] = q6_K_add_offsets(offset_acc[m], scale_pairs, d8, x);
        }
    }
    for (int m = 0; m < ROWS; m++) {
        store_columns(s + (size_t) m * bs, acc[m], offset_acc[m]);
    }
}

#endif

}  // namespace speclens

// s[m * bs + c] = row m of vy (nr rows of n values, each n / 256 block_q8_K) . column c of vx (nc columns repacked
// 8 at a time as BLOCK). A row's result does not depend on how many rows come with it.
namespace speclens {
template <typename BLOCK, void (*KERNEL1)(int, float *, size_t, const BLOCK *, const block_q8_K *),
          void (*KERNEL2)(int, float *, size_t, const BLOCK *, const block_q8_K *),
          void (*KERNEL3)(int, float *, size_t, const BLOCK *, const block_q8_K *),
          void (*KERNEL4)(int, float *, size_t, const BLOCK *, const block_q8_K *)>
static void rows_product(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc) {
    const int nb = n / QK_K;
    const block_q8_K * a = (const block_q8_K *) vy;
    for (int x = 0; x < nc / 8; x++) {
        const BLOCK * w = (const BLOCK *) vx + (size_t) x * nb;
        for (int m = 0; m < nr; m += 4) {
            float * out = s + (size_t) m * bs + x * 8;
            const block_q8_K * rows = a + (size_t) m * nb;
            switch (nr - m) {
                case 1: KERNEL1(nb, out, bs, w, rows); break;
                case 2: KERNEL2(nb, out, bs, w, rows); break;
                case 3: KERNEL3(nb, out, bs, w, rows); break;
                default: KERNEL4(nb, out, bs, w, rows); break;
            }
        }
    }
}
}  // namespace speclens

extern "C" void speclens_gemm_q4_K_8x8_q8_K(int n, float * s, size_t bs, const void * vx, const void * vy, int nr,
                                            int nc) {
    speclens::rows_product<block_q4_Kx8, speclens::q4_K_rows_block<1>, speclens::q4_K_rows_block<2>,
                           speclens::q4_K_rows_block<3>, speclens::q4_K_rows_block<4>>(n, s, bs, vx, vy, nr, nc);
}

extern "C" void speclens_gemm_q6_K_8x8_q8_K(int n, float * s, size_t bs, const void * vx, const void * vy, int nr,
                                            int nc) {
    speclens::rows_product<block_q6_Kx8, speclens::q6_K_rows_block<1>, speclens::q6_K_rows_block<2>,
                           speclens::q6_K_rows_block<3>, speclens::q6_K_rows_block<4>>(n, s, bs, vx, vy, nr, nc);
}
#endif
