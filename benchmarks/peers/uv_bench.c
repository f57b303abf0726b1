/* The runtime benchmarks' timer, offload, file and process cases written on libuv, for
 * side-by-side runs with spindle-bench (same sizes, same output format). */

#include <uv.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

/* process_spawn: /bin/true through uv_spawn, waited for by its exit
 * callback (libuv's SIGCHLD handler), 1 and 8 in flight, then 1 in flight
 * with a touched heap of SPINDLE_BENCH_HEAP_MIB (default 1024). */
static long spawns_left, spawn_failed;

static void start_child(uv_loop_t* loop, uv_process_t* p);
static void after_close(uv_handle_t* h) {
    uv_process_t* p = (uv_process_t*)h;
    if (spawns_left > 0) start_child(h->loop, p);
}
static void child_exited(uv_process_t* p, int64_t status, int signo) {
    if (status != 0 || signo != 0) ++spawn_failed;
    uv_close((uv_handle_t*)p, after_close);
}
static void start_child(uv_loop_t* loop, uv_process_t* p) {
    static char* argv[] = {"/bin/true", NULL};
    uv_process_options_t options;
    memset(&options, 0, sizeof options);
    options.file = argv[0];
    options.args = argv;
    options.exit_cb = child_exited;
    --spawns_left;
    if (uv_spawn(loop, p, &options) != 0) {
        ++spawn_failed;
        uv_close((uv_handle_t*)p, after_close);
    }
}

#define SPAWN_MAX_IN_FLIGHT 8
static double spawn_round(long n, long in_flight) {
    static uv_process_t children[SPAWN_MAX_IN_FLIGHT];
    uv_loop_t loop;
    uv_loop_init(&loop);
    spawns_left = n / in_flight * in_flight;
    double t0 = wall_ns();
    for (long i = 0; i < in_flight; ++i) start_child(&loop, &children[i]);
    uv_run(&loop, UV_RUN_DEFAULT);
    double ns = (wall_ns() - t0) / (double)(n / in_flight * in_flight);
    uv_loop_close(&loop);
    return ns;
}

static double median_spawn(long n, long in_flight) {
    double v[3];
    for (int i = 0; i < 3; ++i) v[i] = spawn_round(n, in_flight);
    qsort(v, 3, sizeof v[0], compare_doubles);
    return v[1];
}

static void bench_process_spawn(void) {
    const char* env = getenv("SPINDLE_BENCH_SPAWNS");
    long n = env ? atol(env) : 2000;
    if (n < 16) n = 16;
    spawn_round(16, 1);
    double one = median_spawn(n, 1);
    double many = median_spawn(n, SPAWN_MAX_IN_FLIGHT);
    const char* heap_env = getenv("SPINDLE_BENCH_HEAP_MIB");
    long heap_mib = heap_env ? atol(heap_env) : 1024;
    double heavy = 0;
    if (heap_mib > 0) {
        size_t bytes = (size_t)heap_mib << 20;
        void* heap = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (heap != MAP_FAILED) {
            memset(heap, 1, bytes);
            heavy = median_spawn(n / 4, 1);
            munmap(heap, bytes);
        }
    }
    if (spawn_failed) printf("process_spawn: %ld children failed\n", spawn_failed);
    printf(
        "process_spawn ns_per_op=%.1f in_flight=1 spawns=%ld in_flight_8_ns_per_op=%.1f heap_mib=%ld "
        "heap_ns_per_op=%.1f program=/bin/true\n",
        one, n, many, heap_mib, heavy);
}

/* process_pipe: SPINDLE_BENCH_CAT_MIB (default 1024) through `cat`: 64 KiB
 * writes to its stdin pipe, one in flight, while its stdout pipe is read. */
static char cat_chunk[64 * 1024];
static char cat_buf[64 * 1024];
static size_t cat_bytes, cat_sent, cat_got;
static long cat_failed;
static uv_pipe_t cat_in, cat_out;
static uv_write_t cat_write;
static uv_process_t cat_child;

static void on_written(uv_write_t* w, int status);
static void write_next(void) {
    uv_buf_t b = uv_buf_init(cat_chunk, sizeof cat_chunk);
    cat_sent += sizeof cat_chunk;
    uv_write(&cat_write, (uv_stream_t*)&cat_in, &b, 1, on_written);
}
static void on_written(uv_write_t* w, int status) {
    (void)w;
    if (status != 0) ++cat_failed;
    if (status == 0 && cat_sent < cat_bytes)
        write_next();
    else
        uv_close((uv_handle_t*)&cat_in, NULL); /* cat's end of input */
}
static void cat_alloc(uv_handle_t* h, size_t suggested, uv_buf_t* b) {
    (void)h;
    (void)suggested;
    *b = uv_buf_init(cat_buf, sizeof cat_buf);
}
static void cat_read(uv_stream_t* s, ssize_t n, const uv_buf_t* b) {
    (void)b;
    if (n > 0) cat_got += (size_t)n;
    if (n < 0) {
        if (n != UV_EOF) ++cat_failed;
        uv_close((uv_handle_t*)s, NULL);
    }
}
static void cat_exit(uv_process_t* p, int64_t status, int signo) {
    if (status != 0 || signo != 0) ++cat_failed;
    uv_close((uv_handle_t*)p, NULL);
}

static double cat_round(double* cpu_sum) {
    static char* argv[] = {"cat", NULL};
    uv_loop_t loop;
    uv_loop_init(&loop);
    uv_pipe_init(&loop, &cat_in, 0);
    uv_pipe_init(&loop, &cat_out, 0);
    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_CREATE_PIPE | UV_READABLE_PIPE;
    stdio[0].data.stream = (uv_stream_t*)&cat_in;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t*)&cat_out;
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = 2;
    uv_process_options_t options;
    memset(&options, 0, sizeof options);
    options.file = argv[0];
    options.args = argv;
    options.exit_cb = cat_exit;
    options.stdio = stdio;
    options.stdio_count = 3;
    cat_sent = cat_got = 0;
    double c0 = cpu_ns(), t0 = wall_ns();
    if (uv_spawn(&loop, &cat_child, &options) != 0) {
        ++cat_failed;
        return 0;
    }
    uv_read_start((uv_stream_t*)&cat_out, cat_alloc, cat_read);
    write_next();
    uv_run(&loop, UV_RUN_DEFAULT);
    double wall = wall_ns() - t0;
    *cpu_sum += cpu_ns() - c0;
    if (cat_got != cat_bytes) ++cat_failed;
    uv_loop_close(&loop);
    return wall;
}

static void bench_process_pipe(void) {
    const char* env = getenv("SPINDLE_BENCH_CAT_MIB");
    long mib = env ? atol(env) : 1024;
    if (mib < 1) mib = 1;
    cat_bytes = (size_t)mib << 20;
    memset(cat_chunk, 'x', sizeof cat_chunk);
    double cpu_sum = 0, v[3];
    cat_round(&cpu_sum);
    cpu_sum = 0;
    for (int i = 0; i < 3; ++i) v[i] = cat_round(&cpu_sum);
    qsort(v, 3, sizeof v[0], compare_doubles);
    if (cat_failed) printf("process_pipe: %ld rounds failed\n", cat_failed);
    printf("process_pipe ns_per_op=%.1f per_64kib mib_per_s=%.0f parent_cpu_ns_per_64kib=%.1f mib=%ld program=cat\n",
           v[1] / ((double)mib * 16), (double)mib / (v[1] / 1e9), cpu_sum / 3 / ((double)mib * 16), mib);
}

int main(int argc, char** argv) {
    int all = argc == 1;
    for (int i = 1; i < argc; ++i) all = all || strcmp(argv[i], "all") == 0;
    int want_fire = all, want_cancel = all, want_offload = all, want_file = all, want_spawn = all, want_pipe = all;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "timers_fire") == 0) want_fire = 1;
        if (strcmp(argv[i], "timers_cancel") == 0) want_cancel = 1;
        if (strcmp(argv[i], "offload") == 0) want_offload = 1;
        if (strcmp(argv[i], "file_read") == 0) want_file = 1;
        if (strcmp(argv[i], "process_spawn") == 0) want_spawn = 1;
        if (strcmp(argv[i], "process_pipe") == 0) want_pipe = 1;
    }
    if (want_fire) bench_timers_fire();
    fflush(stdout);
    if (want_cancel) bench_timers_cancel();
    fflush(stdout);
    if (want_offload) bench_offload();
    fflush(stdout);
    if (want_file) bench_file_read();
    fflush(stdout);
    if (want_spawn) bench_process_spawn();
    fflush(stdout);
    if (want_pipe) bench_process_pipe();
    (void)wall_ns;
    return 0;
}
