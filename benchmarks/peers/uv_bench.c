/* The runtime benchmarks' timer and cross-thread cases written on libuv, for
 * side-by-side runs with spindle-bench (same sizes, same output format). */

#include <uv.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static double wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* splitmix64: a fixed-seed generator so every run schedules the same timers. */
static uint64_t rng_state;
static uint64_t next_random(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static long fired;
static void on_timer(uv_timer_t* t) {
    (void)t;
    ++fired;
}

#define TIMERS 1000000L

static void bench_timers_fire(void) {
    uv_loop_t loop;
    uv_loop_init(&loop);
    uv_timer_t* timers = calloc(TIMERS, sizeof *timers);
    for (long i = 0; i < TIMERS; ++i) uv_timer_init(&loop, &timers[i]);
    rng_state = 42;
    double cold = 0;
    for (int round = 1; round <= 2; ++round) {
        fired = 0;
        uv_update_time(&loop);
        double c0 = cpu_ns();
        /* libuv timers have millisecond resolution: 0..999 ms. */
        for (long i = 0; i < TIMERS; ++i) uv_timer_start(&timers[i], on_timer, next_random() % 1000, 0);
        double c1 = cpu_ns();
        uv_run(&loop, UV_RUN_DEFAULT);
        double c2 = cpu_ns();
        if (round == 1) {
            cold = (c2 - c0) / TIMERS;
            continue;
        }
        printf("timers_fire ns_per_op=%.1f timers=%ld fired=%ld schedule_cpu_ns=%.1f fire_cpu_ns=%.1f first_round_ns_per_op=%.1f\n",
               (c2 - c0) / TIMERS, TIMERS, fired, (c1 - c0) / TIMERS, (c2 - c1) / TIMERS, cold);
    }
    for (long i = 0; i < TIMERS; ++i) uv_close((uv_handle_t*)&timers[i], NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    free(timers);
}

static void bench_timers_cancel(void) {
    uv_loop_t loop;
    uv_loop_init(&loop);
    uv_timer_t* timers = calloc(TIMERS, sizeof *timers);
    for (long i = 0; i < TIMERS; ++i) uv_timer_init(&loop, &timers[i]);
    rng_state = 7;
    fired = 0;
    double c0 = cpu_ns();
    for (long i = 0; i < TIMERS; ++i) uv_timer_start(&timers[i], on_timer, 1000 + next_random() % 1000, 0);
    double c1 = cpu_ns();
    for (long i = 0; i < TIMERS; ++i) uv_timer_stop(&timers[i]);
    double c2 = cpu_ns();
    printf("timers_cancel ns_per_op=%.1f timers=%ld schedule_ns=%.1f fired=%ld\n", (c2 - c1) / TIMERS, TIMERS,
           (c1 - c0) / TIMERS, fired);
    for (long i = 0; i < TIMERS; ++i) uv_close((uv_handle_t*)&timers[i], NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    free(timers);
}

int main(int argc, char** argv) {
    int all = argc == 1;
    for (int i = 1; i < argc; ++i) all = all || strcmp(argv[i], "all") == 0;
    int want_fire = all, want_cancel = all;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "timers_fire") == 0) want_fire = 1;
        if (strcmp(argv[i], "timers_cancel") == 0) want_cancel = 1;
    }
    if (want_fire) bench_timers_fire();
    fflush(stdout);
    if (want_cancel) bench_timers_cancel();
    (void)wall_ns;
    return 0;
}
