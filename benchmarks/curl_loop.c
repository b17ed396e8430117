/* A bare libcurl multi loop: the baseline benchmarks/scale.py holds bulkfetch's CPU per file
 * to (issue 21).
 *
 *     gcc -O2 curl_loop.c -lcurl -o curl_loop
 *     ./curl_loop CONCURRENCY [URLS.txt | -]
 *
 * (benchmarks/scale.py builds it by default against the libcurl pycurl loads, so that both
 * sides of the comparison run the same libcurl.)
 *
 * Reads URLs, one a line, from the file (or stdin), keeps CONCURRENCY transfers in flight on
 * a pool of as many easy handles (made once, reused: only CURLOPT_URL is set per transfer),
 * throws every body away in a write callback that only counts bytes, counts a transfer as ok
 * when it ended without a curl error and with HTTP 200, and prints one line of JSON at the
 * end: {"ok": N, "failed": N, "bytes": N, "seconds": S, ...}. Exit status 0 when none failed.
 *
 * The loop has the shape bulkfetch's engine has (engine/fetcher.py step(): pycurl's
 * perform, info_read, select): start transfers on free handles, curl_multi_perform,
 * curl_multi_info_read until empty, then wait in curl_multi_poll. The alternative shape is
 * the event-driven one (curl_multi_socket_action with CURLMOPT_SOCKETFUNCTION and
 * CURLMOPT_TIMERFUNCTION on an epoll loop), where libcurl touches only the sockets that
 * fired; it is not what bulkfetch does, so it is not the baseline here.
 *
 * The easy options are the ones bulkfetch's engine/curl.py new_handle() sets where they
 * change what a transfer costs (no signals, no proxy lookup in the environment, no content
 * decoding, TCP_NODELAY, the same timeouts and redirect rules); bulkfetch's own work (header
 * capture, MD5 of every body, Content-Length check, the sink) is what the comparison
 * measures, so none of it is done here.
 */
#define _GNU_SOURCE
#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static curl_off_t body_bytes;

static size_t discard(char *data, size_t size, size_t count, void *user)
{
    (void)data;
    (void)user;
    body_bytes += (curl_off_t)(size * count);
    return size * count;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* 4,096 transfers hold 4,096 sockets: raise the soft descriptor limit to the hard one. */
static void raise_open_files(void)
{
    struct rlimit limit;
    if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
        limit.rlim_cur = limit.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &limit) != 0)
            fprintf(stderr, "curl_loop: setrlimit(RLIMIT_NOFILE): %s\n", strerror(errno));
    }
}

static CURL *new_handle(void)
{
    CURL *handle = curl_easy_init();
    if (handle == NULL)
        return NULL;
    /* as bulkfetch's new_handle() with its default Timeouts and --spool-above */
    curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(handle, CURLOPT_USERAGENT, "curl_loop");
    curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(handle, CURLOPT_LOW_SPEED_LIMIT, 100L);
    curl_easy_setopt(handle, CURLOPT_LOW_SPEED_TIME, 30L);
    curl_easy_setopt(handle, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(handle, CURLOPT_MAXREDIRS, 5L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(handle, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(handle, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(handle, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
    curl_easy_setopt(handle, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(handle, CURLOPT_HTTP_CONTENT_DECODING, 0L);
    curl_easy_setopt(handle, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(handle, CURLOPT_PROXY, "");   /* no proxy variables read per transfer */
    curl_easy_setopt(handle, CURLOPT_NOPROXY, "");
    curl_easy_setopt(handle, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)1 << 20);
    curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, discard);
    return handle;
}

/* The next URL of `input` (its line end cut off) in *line, or 0 at the end. */
static int next_url(FILE *input, char **line, size_t *room)
{
    ssize_t length;
    while ((length = getline(line, room, input)) >= 0) {
        while (length > 0 && ((*line)[length - 1] == '\n' || (*line)[length - 1] == '\r'))
            (*line)[--length] = '\0';
        if (length > 0)
            return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3 || atol(argv[1]) < 1) {
        fprintf(stderr, "usage: %s CONCURRENCY [URLS.txt | -]\n", argv[0]);
        return 2;
    }
    long concurrency = atol(argv[1]);
    FILE *input = stdin;
    if (argc == 3 && strcmp(argv[2], "-") != 0 && (input = fopen(argv[2], "r")) == NULL) {
        fprintf(stderr, "curl_loop: %s: %s\n", argv[2], strerror(errno));
        return 2;
    }
    raise_open_files();
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "curl_loop: curl_global_init failed\n");
        return 2;
    }
    CURLM *multi = curl_multi_init();
    CURL **free_handles = calloc((size_t)concurrency, sizeof *free_handles);
    CURL **all = calloc((size_t)concurrency, sizeof *all);
    if (multi == NULL || free_handles == NULL || all == NULL) {
        fprintf(stderr, "curl_loop: out of memory\n");
        return 2;
    }
    long free_count = 0;
    for (long i = 0; i < concurrency; i++) {
        if ((all[i] = new_handle()) == NULL) {
            fprintf(stderr, "curl_loop: curl_easy_init failed\n");
            return 2;
        }
        free_handles[free_count++] = all[i];
    }

    char *line = NULL;
    size_t room = 0;
    int more = 1;
    long ok = 0, failed = 0, reported = 0;
    double started = now();
    for (;;) {
        /* start transfers on the free handles */
        while (more && free_count > 0) {
            if (!next_url(input, &line, &room)) {
                more = 0;
                break;
            }
            CURL *handle = free_handles[--free_count];
            curl_easy_setopt(handle, CURLOPT_URL, line);  /* libcurl copies the string */
            curl_multi_add_handle(multi, handle);
        }
        int running = 0;
        CURLMcode code = curl_multi_perform(multi, &running);
        if (code != CURLM_OK) {
            fprintf(stderr, "curl_loop: curl_multi_perform: %s\n", curl_multi_strerror(code));
            return 2;
        }
        int queued;
        CURLMsg *message;
        while ((message = curl_multi_info_read(multi, &queued)) != NULL) {
            if (message->msg != CURLMSG_DONE)
                continue;
            CURL *handle = message->easy_handle;
            CURLcode result = message->data.result;
            long status = 0;
            curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &status);
            if (result == CURLE_OK && status == 200) {
                ok++;
            } else {
                failed++;
                if (reported++ < 5) {
                    char *url = NULL;
                    curl_easy_getinfo(handle, CURLINFO_EFFECTIVE_URL, &url);
                    fprintf(stderr, "curl_loop: %s: %s, HTTP %ld\n", url ? url : "?",
                            curl_easy_strerror(result), status);
                }
            }
            curl_multi_remove_handle(multi, handle);
            free_handles[free_count++] = handle;
        }
        if (!more && free_count == concurrency)
            break;
        /* as step(): wait even when handles came free (they start on the next turn) */
        code = curl_multi_poll(multi, NULL, 0, 1000, NULL);
        if (code != CURLM_OK) {
            fprintf(stderr, "curl_loop: curl_multi_poll: %s\n", curl_multi_strerror(code));
            return 2;
        }
    }
    double seconds = now() - started;

    printf("{\"ok\": %ld, \"failed\": %ld, \"bytes\": %" CURL_FORMAT_CURL_OFF_T
           ", \"seconds\": %.3f, \"concurrency\": %ld, \"libcurl\": \"%s\"}\n",
           ok, failed, body_bytes, seconds, concurrency, curl_version_info(CURLVERSION_NOW)->version);
    for (long i = 0; i < concurrency; i++)
        curl_easy_cleanup(all[i]);
    curl_multi_cleanup(multi);
    curl_global_cleanup();
    free(line);
    free(all);
    free(free_handles);
    if (input != stdin)
        fclose(input);
    return failed == 0 ? 0 : 1;
}
