#include <stdint.h>
#include <string.h>
/* rows of row_words uint64 words at base: hash each (multiply-xor over non-zero words with their
   index), group equal rows (verified with memcmp), compact the distinct ones to the front in
   order of first appearance, write each row's slot to index; return the distinct count. */
int64_t dedup_rows(uint64_t *base, int64_t rows, int64_t row_words, int32_t *index) {
    uint64_t hashes[4096];
    int64_t firsts[4096];
    int64_t u = 0;
    for (int64_t i = 0; i < rows; i++) {
        const uint64_t *r = base + i * row_words;
        uint64_t h = 0x9E3779B97F4A7C15ull;
        for (int64_t w = 0; w < row_words; w += 4) {
            uint64_t a = r[w] | r[w + 1] | r[w + 2] | r[w + 3];
            if (a) {
                for (int k = 0; k < 4; k++) if (r[w + k]) { h ^= r[w + k] + (uint64_t)(w + k) * 0xff51afd7ed558ccdull; h *= 0xc4ceb9fe1a85ec53ull; }
            }
        }
        int64_t slot = -1;
        for (int64_t j = 0; j < u; j++) {
            if (hashes[j] == h && memcmp(base + j * row_words, r, row_words * 8) == 0) { slot = j; break; }
        }
        if (slot < 0) {
            slot = u; hashes[u] = h; firsts[u] = i; u++;
            if (slot != i) memcpy(base + slot * row_words, r, row_words * 8);
        }
        index[i] = (int32_t)slot;
    }
    return u;
}
