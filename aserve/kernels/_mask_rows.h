/* Structured outputs: a step's distinct masks (aserve/sampling/masks.py distinct_masks).
 *
 * A split step's masks (one row of row_bytes per constrained row) repeat: the requests of one
 * schema meet the same few grammar states (a 256-row step of the device bench's schema fills
 * 4 distinct masks, docs/benchmarks.md, session 25), and copying every row to the device took
 * 0.2-0.8 ms of the step's chain on the H200 (session 26). Here the distinct rows are copied
 * out to dst in order of first appearance and index[r] says which of them row r is; the copy
 * then moves those and the index.
 *
 * Rows are hashed on the pool, grouped by hash on the calling thread, and on the pool again
 * each row is compared byte for byte with its group's first row while the first rows are
 * copied out: equal hashes are never taken for equal masks. Included by _ggufmm.c (its pool). */

struct mask_rows_args {
    const uint8_t *src;
    int64_t row_bytes;
    uint64_t *hash; /* [rows] */
    const int64_t *first; /* [distinct]: each group's first row */
    int32_t *index; /* [rows] */
    uint8_t *dst;
    _Atomic int differ; /* a row whose hash matched its group's but whose bytes did not */
    int weak; /* tests: every row hashes alike, so grouping rests on the comparison alone */
};

/* Adds and xors over 8 lanes of 64-bit words (vectorized by the compiler, so the pass runs at
 * the memory's pace), the xor lanes mixing in the running sums (a word's position counts),
 * then a multiply-xorshift finish. Not a strong hash: it only sorts rows into candidates. */
static uint64_t mask_row_hash(const uint8_t *p, int64_t n) {
    uint64_t s[8] = {0}, x[8] = {0};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        uint64_t w[8];
        memcpy(w, p + i, 64);
        for (int k = 0; k < 8; k++) {
            s[k] += w[k];
            x[k] ^= w[k] + s[k];
        }
    }
    uint64_t h = (uint64_t)n;
    for (int k = 0; k < 8; k++) {
        h = (h ^ s[k]) * 0x9E3779B97F4A7C15ull;
        h = (h ^ x[k]) * 0xC2B2AE3D27D4EB4Full;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 29);
}

static void mask_rows_hash(const struct job *j, int64_t start, int64_t end) {
    struct mask_rows_args *a = (struct mask_rows_args *)j->ctx;
    for (int64_t r = start; r < end; r++) a->hash[r] = a->weak ? 0 : mask_row_hash(a->src + r * a->row_bytes, a->row_bytes);
}

static void mask_rows_check(const struct job *j, int64_t start, int64_t end) {
    struct mask_rows_args *a = (struct mask_rows_args *)j->ctx;
    const int64_t rb = a->row_bytes;
    for (int64_t r = start; r < end; r++) {
        const int64_t g = a->index[r], f = a->first[g];
        if (f == r)
            memcpy(a->dst + g * rb, a->src + r * rb, (size_t)rb);
        else if (memcmp(a->src + r * rb, a->src + f * rb, (size_t)rb) != 0)
            atomic_store_explicit(&a->differ, 1, memory_order_relaxed);
    }
}

/* The distinct count (rows 0 .. count - 1 of dst), -1 if there are more than cap, -2 if two
 * rows hashed alike but differ (then dst and index are not to be used), -3 out of memory.
 * No GIL. */
static int64_t mask_rows_distinct(const uint8_t *src, int64_t rows, int64_t row_bytes, uint8_t *dst, int64_t cap,
                                  int32_t *index, int threads, int weak) {
    if (rows <= 0) return 0;
    int64_t slots = 16;
    while (slots < 2 * rows) slots *= 2;
    uint64_t *hash = malloc((size_t)rows * sizeof(uint64_t));
    int64_t *first = malloc((size_t)(cap > 0 ? cap : 1) * sizeof(int64_t));
    int32_t *table = malloc((size_t)slots * sizeof(int32_t)); /* open addressing: a group, or -1 */
    int64_t count = -3;
    if (hash == NULL || first == NULL || table == NULL) goto out;
    struct mask_rows_args a = {src, row_bytes, hash, first, index, dst, 0, weak};
    struct job j = {0};
    j.ctx = &a;
    j.n = rows;
    j.chunk_rows = rows >= 64 ? 4 : 1;
    const int64_t chunks = (rows + j.chunk_rows - 1) / j.chunk_rows;
    j.rowfn = mask_rows_hash;
    j.spin_ns = 200000; /* the comparison's call follows at once */
    if (run_job(&j, chunks, threads) != 0) goto out;
    for (int64_t s = 0; s < slots; s++) table[s] = -1;
    count = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t s = (int64_t)(hash[r] & (uint64_t)(slots - 1));
        while (table[s] >= 0 && hash[first[table[s]]] != hash[r]) s = (s + 1) & (slots - 1);
        if (table[s] < 0) {
            if (count == cap) {
                count = -1;
                goto out;
            }
            first[count] = r;
            table[s] = (int32_t)count++;
        }
        index[r] = table[s];
    }
    j.rowfn = mask_rows_check;
    j.spin_ns = -1; /* the next step is a device step away: the helpers sleep */
    if (run_job(&j, chunks, threads) != 0) count = -3;
    else if (atomic_load(&a.differ)) count = -2;
out:
    free(hash);
    free(first);
    free(table);
    return count;
}
