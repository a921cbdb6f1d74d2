/* tests/nvtx_tool/nvtx_recorder.h: what the NVTX recorder library (nvtx_recorder.cpp, target
 * ccgraph_nvtx_recorder) lets a test read. The library is an NVTX tool, loaded by NVTX through
 * NVTX_INJECTION64_PATH (a dynamic injection); tests/gpu/test_nvtx.cu finds it with dlopen and
 * calls these through dlsym. Plain C: the library is built by the host compiler, the test by nvcc. */
#ifndef CCGRAPH_TESTS_NVTX_RECORDER_H
#define CCGRAPH_TESTS_NVTX_RECORDER_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One event of ccgraph's NVTX domain ("ccgraph"), in the order NVTX delivered them. */
typedef struct ccgraph_nvtx_event {
  const char* name; /* the range's name for a push (the library's copy, kept for the process's
                       lifetime); null for a pop */
  int registered;   /* a push named by a string registered in the domain (1), or by an ASCII
                       message (0) */
  int depth;        /* the domain's nesting depth after the event: 1 after an outermost push,
                       0 after its pop */
} ccgraph_nvtx_event;

typedef struct ccgraph_nvtx_record {
  int initialised;    /* calls of InitializeInjectionNvtx2 that installed the recorder (one per
                         module with its own NVTX copy: the program, NCCL, ...) */
  int failed;         /* calls that could not (no callback table): the recorder then lets NVTX
                         go on rather than being unloaded, so a test sees the failure here */
  int depth;          /* the ccgraph domain's nesting depth now */
  int max_depth;      /* its largest since the process started */
  size_t events;      /* ccgraph-domain events so far (pushes and pops) */
  size_t strings;     /* strings registered in the ccgraph domain so far */
  size_t domains;     /* domains created (ccgraph's, NCCL's, ...) */
  long other_ranges;  /* ranges pushed in other domains */
} ccgraph_nvtx_record;

/* Fills *record (when not null) and copies the events [first, first + cap) that exist into
 * events; returns how many it copied. */
typedef size_t (*ccgraph_nvtx_recorder_query_fn)(ccgraph_nvtx_record* record, ccgraph_nvtx_event* events,
                                                 size_t first, size_t cap);
/* The i-th string registered in the ccgraph domain (the library's copy), null past the last. */
typedef const char* (*ccgraph_nvtx_recorder_string_fn)(size_t i);

size_t ccgraph_nvtx_recorder_query(ccgraph_nvtx_record* record, ccgraph_nvtx_event* events, size_t first,
                                   size_t cap);
const char* ccgraph_nvtx_recorder_string(size_t i);

#ifdef __cplusplus
}
#endif

#endif
