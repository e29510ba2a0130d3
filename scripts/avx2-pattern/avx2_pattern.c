// What the core's vector pipes allow for the AVX2 super-block kernels' inner loop (issue 15):
// cycles per `vpmaddubsw` (32 products of 8 weight rows × 4 values against one activation row)
// for the instruction mixes the kernels can use, all operands in registers or L1 (and, on a CPU
// with AVX-512 VNNI, the AVX-512 row for comparison).
//
//   cc -O2 -o /tmp/avx2_pattern scripts/avx2-pattern/avx2_pattern.c && taskset -c 1 /tmp/avx2_pattern
//
// Each mix is a fixed block of inline assembly (so no compiler reorders, merges or spills it),
// repeated; the clock is measured with a chain of dependent adds (one per cycle), so the figures
// are cycles on any x86-64 CPU with AVX2. Figures and what they mean: BENCHMARKS.md.
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static int32_t buf[2048] __attribute__((aligned(64)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// Cycles per second: four dependent adds per iteration, one cycle each.
static double clock_hz(void) {
    const long n = 1000000000L;
    double a = now();
    __asm__ volatile("mov %0, %%rcx\n1:\n add $1, %%rax\n add $1, %%rax\n add $1, %%rax\n"
                     " add $1, %%rax\n sub $4, %%rcx\n jnz 1b\n" ::"r"(n)
                     : "rax", "rcx");
    return n / (now() - a);
}

#define CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
                "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory"
#define ITERS 100000000L
// Runs `body` (which issues `per` multiplies) until ITERS multiplies, prints cycles per one.
#define MEASURE(name, body, per)                                                            \
    do {                                                                                    \
        double t0 = now();                                                                  \
        for (long k = 0; k < ITERS / (per); k++) __asm__ volatile(body ::"r"(buf) : CLOBBER); \
        printf("%-62s %.3f\n", name, (now() - t0) * hz / ITERS);                            \
    } while (0)

#define X8(m) m(0) m(1) m(2) m(3) m(4) m(5) m(6) m(7)
// One mix element per i; accumulators ymm0..7 are independent of each other.
#define MUL_ONLY(i) "vpmaddubsw %%ymm8, %%ymm9, %%ymm" #i "\n"
#define BCAST_ONLY(i) "vpbroadcastd 4*" #i "(%0), %%ymm" #i "\n"
#define MUL_ADD(i) "vpmaddubsw %%ymm12, %%ymm13, %%ymm14\n vpaddw %%ymm14, %%ymm" #i ", %%ymm" #i "\n"
#define BCAST_MUL_ADD(i)                                                                   \
    "vpbroadcastd 4*" #i "(%0), %%ymm15\n vpmaddubsw %%ymm15, %%ymm9, %%ymm14\n"            \
    " vpaddw %%ymm14, %%ymm" #i ", %%ymm" #i "\n"

// The kernels' row loop as LLVM emits it for a wide tile: the sub-block's eight weight vectors
// in ymm0..7; per activation row eight broadcasts and multiplies summed in i16, one `vpmaddwd` by
// the rows' scales, and the row's i32 sums added in memory.
#define FIRST(c, t) "vpbroadcastd 4*" #c "(%0), %%ymm" #t "\n vpmaddubsw %%ymm" #t ", %%ymm" #c ", %%ymm" #t "\n"
#define NEXT(c, t) FIRST(c, t) " vpaddw %%ymm" #t ", %%ymm8, %%ymm8\n"
#define ROW(r)                                                                             \
    FIRST(0, 8) NEXT(1, 9) NEXT(2, 10) NEXT(3, 11) NEXT(4, 12) NEXT(5, 13) NEXT(6, 14)   \
    NEXT(7, 9) "vpmaddwd 128(%0), %%ymm8, %%ymm8\n vpaddd 1024+32*" #r "(%0), %%ymm8, %%ymm8\n" \
    " vmovdqa %%ymm8, 1024+32*" #r "(%0)\n"
// The same with the sub-block's decode in front (four 32-byte loads, nibbles split by shift and
// mask: what Q4_K costs once per sub-block for all rows).
#define DECODE                                                                             \
    "vmovdqu 512(%0), %%ymm0\n vmovdqu 544(%0), %%ymm2\n vmovdqu 576(%0), %%ymm4\n"        \
    " vmovdqu 608(%0), %%ymm6\n vmovdqa 640(%0), %%ymm15\n"                               \
    " vpsrlw $4, %%ymm0, %%ymm1\n vpsrlw $4, %%ymm2, %%ymm3\n vpsrlw $4, %%ymm4, %%ymm5\n" \
    " vpsrlw $4, %%ymm6, %%ymm7\n vpand %%ymm0, %%ymm15, %%ymm0\n vpand %%ymm1, %%ymm15, %%ymm1\n" \
    " vpand %%ymm2, %%ymm15, %%ymm2\n vpand %%ymm3, %%ymm15, %%ymm3\n vpand %%ymm4, %%ymm15, %%ymm4\n" \
    " vpand %%ymm5, %%ymm15, %%ymm5\n vpand %%ymm6, %%ymm15, %%ymm6\n vpand %%ymm7, %%ymm15, %%ymm7\n"
// Half the broadcasts: 64-bit broadcasts (two values' chunks) against weights regrouped as four
// rows × two chunks (two sums per row, added in memory).
#define BQ(k, t) "vpbroadcastq 8*" #k "(%0), %%ymm" #t "\n"
#define PAIR(k, t, w0, w1)                                                                 \
    BQ(k, t) "vpmaddubsw %%ymm" #t ", %%ymm" #w0 ", %%ymm10\n vpmaddubsw %%ymm" #t ", %%ymm" #w1 ", %%ymm11\n" \
    " vpaddw %%ymm10, %%ymm8, %%ymm8\n vpaddw %%ymm11, %%ymm9, %%ymm9\n"
#define ROWQ(r)                                                                            \
    BQ(0, 14) "vpmaddubsw %%ymm14, %%ymm0, %%ymm8\n vpmaddubsw %%ymm14, %%ymm1, %%ymm9\n"  \
    PAIR(1, 15, 2, 3) PAIR(2, 14, 4, 5) PAIR(3, 15, 6, 7)                                  \
    "vpmaddwd 128(%0), %%ymm8, %%ymm8\n vpmaddwd 160(%0), %%ymm9, %%ymm9\n"                \
    " vpaddd 1024+64*" #r "(%0), %%ymm8, %%ymm8\n vmovdqa %%ymm8, 1024+64*" #r "(%0)\n"    \
    " vpaddd 1056+64*" #r "(%0), %%ymm9, %%ymm9\n vmovdqa %%ymm9, 1056+64*" #r "(%0)\n"

// For comparison, the AVX-512 VNNI kernels' row: eight `vpdpbusd` zmm (one chain per row) and
// one `vpmulld` zmm by the sub-block scales; cycles per `vpdpbusd` (64 products of 16 weight rows).
#define ZDP(i) "vpdpbusd %%zmm8, %%zmm9, %%zmm" #i "\n"
#define ZROW(i) ZDP(i) ZDP(i) ZDP(i) ZDP(i) ZDP(i) ZDP(i) ZDP(i) ZDP(i) "vpmulld %%zmm" #i ", %%zmm9, %%zmm" #i "\n"

int main(void) {
    for (int i = 0; i < 2048; i++) buf[i] = 0x0f0f0f0f;
    double hz = clock_hz();
    printf("clock %.2f GHz; cycles per vpmaddubsw (or per instruction where alone):\n", hz / 1e9);
    for (int round = 0; round < 2; round++) {
        MEASURE("vpmaddubsw alone (8 independent)", X8(MUL_ONLY), 8);
        MEASURE("vpbroadcastd from memory alone", X8(BCAST_ONLY), 8);
        MEASURE("vpmaddubsw + vpaddw (8 independent sums)", X8(MUL_ADD), 8);
        MEASURE("vpbroadcastd + vpmaddubsw + vpaddw (8 independent sums)", X8(BCAST_MUL_ADD), 8);
        MEASURE("row loop: 8 rows x 8 chunks, rows' sums in memory", X8(ROW), 64);
        MEASURE("row loop with the sub-block's decode", DECODE X8(ROW), 64);
        MEASURE("row loop, 64-bit broadcasts (4 rows x 2 chunks)", X8(ROWQ), 64);
        if (__builtin_cpu_supports("avx512vnni")) {
            MEASURE("AVX-512: vpdpbusd zmm alone (8 chains), per vpdpbusd", X8(ZDP), 8);
            MEASURE("AVX-512: row of 8 vpdpbusd + vpmulld, per vpdpbusd", X8(ZROW), 64);
        }
    }
    return 0;
}
