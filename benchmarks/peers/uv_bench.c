/* The runtime benchmarks' timer and cross-thread cases written on libuv, for
 * side-by-side runs with spindle-bench (same sizes, same output format). */

#include <uv.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* offload: an empty job through uv_queue_work and back, one at a time, then
 * 16 in flight (libuv's pool has 4 threads by default). */
#define OFFLOAD_JOBS 20000L
#define OFFLOAD_IN_FLIGHT 16

static long offload_left; /* jobs still to start */
static void empty_work(uv_work_t* w) { (void)w; }
static void after_empty_work(uv_work_t* w, int status) {
    (void)status;
    if (offload_left > 0) {
        --offload_left;
        uv_queue_work(w->loop, w, empty_work, after_empty_work);
    }
}

static double offload_round(long in_flight) {
    uv_loop_t loop;
    uv_loop_init(&loop);
    uv_work_t work[OFFLOAD_IN_FLIGHT];
    /* `in_flight` chains: each job, once done, queues the next while jobs
     * remain, OFFLOAD_JOBS in all. */
    offload_left = OFFLOAD_JOBS - in_flight;
    double t0 = wall_ns();
    for (long i = 0; i < in_flight; ++i) uv_queue_work(&loop, &work[i], empty_work, after_empty_work);
    uv_run(&loop, UV_RUN_DEFAULT);
    double ns = (wall_ns() - t0) / OFFLOAD_JOBS;
    uv_loop_close(&loop);
    return ns;
}

static int compare_doubles(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

static double median_offload(long in_flight) {
    double v[5];
    for (int i = 0; i < 5; ++i) v[i] = offload_round(in_flight);
    qsort(v, 5, sizeof v[0], compare_doubles);
    return v[2];
}

static void bench_offload(void) {
    offload_round(1); /* warm the pool: its threads start on first use */
    double c0 = cpu_ns();
    double serial = median_offload(1);
    double cpu_per_op = (cpu_ns() - c0) / (5.0 * OFFLOAD_JOBS);
    double parallel = median_offload(OFFLOAD_IN_FLIGHT);
    printf("offload ns_per_op=%.1f round_trip_empty_job cpu_ns_per_op=%.1f in_flight_16_ns_per_op=%.1f\n", serial,
           cpu_per_op, parallel);
}

/* file_read: 4 KiB random reads through uv_fs_read from a file in the page
 * cache (SPINDLE_BENCH_FILE_MIB, default 1024), 1 and 64 in flight; the same
 * offsets as spindle-bench (xorshift64, the same seeds). */
#define FILE_READS 200000L
#define FILE_MAX_IN_FLIGHT 64

struct file_reader {
    uv_fs_t req;
    uv_buf_t buf;
    char data[4096];
    uint64_t x;
    long left;
};
static uv_file bench_fd;
static uint64_t bench_blocks;
static long file_failed;

static void start_read(uv_loop_t* loop, struct file_reader* r);
static void after_read(uv_fs_t* req) {
    struct file_reader* r = (struct file_reader*)req->data;
    if (req->result != (ssize_t)sizeof r->data) ++file_failed;
    uv_fs_req_cleanup(req);
    if (r->left > 0) start_read(req->loop, r);
}
static void start_read(uv_loop_t* loop, struct file_reader* r) {
    r->x ^= r->x << 13;
    r->x ^= r->x >> 7;
    r->x ^= r->x << 17;
    --r->left;
    r->buf = uv_buf_init(r->data, sizeof r->data);
    r->req.data = r;
    uv_fs_read(loop, &r->req, bench_fd, &r->buf, 1, (int64_t)((r->x % bench_blocks) * sizeof r->data), after_read);
}

static double file_round(long in_flight, double* cpu_sum) {
    static struct file_reader readers[FILE_MAX_IN_FLIGHT];
    uv_loop_t loop;
    uv_loop_init(&loop);
    double c0 = cpu_ns(), t0 = wall_ns();
    for (long i = 0; i < in_flight; ++i) {
        readers[i].x = 0x9e3779b97f4a7c15ULL + (uint64_t)i;
        readers[i].left = FILE_READS / in_flight;
        start_read(&loop, &readers[i]);
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    double ns = (wall_ns() - t0) / FILE_READS;
    *cpu_sum += (cpu_ns() - c0) / FILE_READS;
    uv_loop_close(&loop);
    return ns;
}

static double median_file(long in_flight, double* cpu_sum) {
    double v[3];
    for (int i = 0; i < 3; ++i) v[i] = file_round(in_flight, cpu_sum);
    qsort(v, 3, sizeof v[0], compare_doubles);
    return v[1];
}

static void bench_file_read(void) {
    const char* mib = getenv("SPINDLE_BENCH_FILE_MIB");
    long n = mib ? atol(mib) : 1024;
    uint64_t bytes = (uint64_t)(n > 0 ? n : 1) << 20;
    char path[] = "/tmp/uv-bench-file-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        printf("file_read: cannot make a temporary file\n");
        return;
    }
    unlink(path);
    static char chunk[1 << 20];
    for (size_t i = 0; i < sizeof chunk; ++i) chunk[i] = (char)(i * 31);
    for (uint64_t done = 0; done < bytes; done += sizeof chunk)
        if (write(fd, chunk, sizeof chunk) != (ssize_t)sizeof chunk) {
            printf("file_read: cannot write the file\n");
            close(fd);
            return;
        }
    bench_fd = fd;
    bench_blocks = bytes / 4096;
    double warm = 0, cpu_one = 0, cpu_many = 0;
    file_round(1, &warm);
    double one = median_file(1, &cpu_one);
    double many = median_file(FILE_MAX_IN_FLIGHT, &cpu_many);
    cpu_one /= 3;
    cpu_many /= 3;
    close(fd);
    if (file_failed) printf("file_read: %ld reads failed\n", file_failed);
    printf(
        "file_read ns_per_op=%.1f in_flight=1 reads_per_s=%.0f cpu_ns_per_op=%.1f in_flight_64_ns_per_op=%.1f "
        "in_flight_64_reads_per_s=%.0f in_flight_64_cpu_ns_per_op=%.1f file_mib=%llu block=4096\n",
        one, 1e9 / one, cpu_one, many, 1e9 / many, cpu_many, (unsigned long long)(bytes >> 20));
}

int main(int argc, char** argv) {
    int all = argc == 1;
    for (int i = 1; i < argc; ++i) all = all || strcmp(argv[i], "all") == 0;
    int want_fire = all, want_cancel = all, want_offload = all, want_file = all;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "timers_fire") == 0) want_fire = 1;
        if (strcmp(argv[i], "timers_cancel") == 0) want_cancel = 1;
        if (strcmp(argv[i], "offload") == 0) want_offload = 1;
        if (strcmp(argv[i], "file_read") == 0) want_file = 1;
    }
    if (want_fire) bench_timers_fire();
    fflush(stdout);
    if (want_cancel) bench_timers_cancel();
    fflush(stdout);
    if (want_offload) bench_offload();
    fflush(stdout);
    if (want_file) bench_file_read();
    (void)wall_ns;
    return 0;
}
