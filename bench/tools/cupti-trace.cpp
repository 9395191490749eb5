// CUPTI injection library for `cargo xtask profile`: records every kernel, memcpy and memset the
// GPU runs, including those replayed from CUDA graphs, into a text file that xtask parses.
//
// Loaded by the CUDA driver through CUDA_INJECTION64_PATH (it calls InitializeInjection when the
// process initialises CUDA); writes to the file named by FRT_CUPTI_TRACE. FRT_CUPTI_LEVEL=graphs
// records one record a CUDA graph launch instead of its kernels, with the copies and the CUDA
// runtime calls (a few hundred a step): the step's GPU span without per-kernel tracing and what the
// host does between steps, which a kernel-level trace (CUPTI's cost on every kernel) cannot give.
// Built by xtask with the C++ compiler of the llama.cpp build against the toolkit's CUPTI
// (extras/CUPTI, or the nvidia-cuda-cupti wheel).
//
// Format, one record per line, fields separated by one space (times in ns, CUPTI's clock):
//   # flashrt-cupti-trace 1
//   n ID NAME                       a kernel name (mangled), before the first kernel that uses it
//   k ID START END DEVICE STREAM CORRELATION GRAPH GX GY GZ BX BY BZ
//   m KIND BYTES START END DEVICE STREAM CORRELATION GRAPH       a memcpy (KIND: HtoD, DtoD, ...)
//   s BYTES START END DEVICE STREAM CORRELATION GRAPH            a memset
//   g START END DEVICE STREAM CORRELATION GRAPH                  a CUDA graph launch (graphs level)
//   a ID START END THREAD CORRELATION                            a CUDA runtime call (graphs level;
//                                                                ID names it, as for kernels)
//   d DROPPED                       records CUPTI dropped (written only when there were some)
//   e                               the end: the file is complete
// GRAPH is the CUDA graph's id (0 outside graphs); a graph's kernels carry the correlation id of
// the cudaGraphLaunch that replayed them.

#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

// Fails the traced process: a partial trace must not pass for a whole one. _Exit, not exit: the
// exit-time flush would wait on the lock a failing callback holds.
#define CUPTI_CHECK(call)                                                                           \
    do {                                                                                            \
        const CUptiResult res_ = (call);                                                            \
        if (res_ != CUPTI_SUCCESS) {                                                                \
            const char * what_ = nullptr;                                                           \
            cuptiGetResultString(res_, &what_);                                                     \
            std::fprintf(stderr, "flashrt-cupti-trace: %s failed: %s\n", #call, what_ ? what_ : "?"); \
            std::_Exit(3);                                                                          \
        }                                                                                           \
    } while (0)

namespace {

// Large buffers keep the callbacks rare: a decode step is ~1600 records of a few hundred bytes.
constexpr size_t BUFFER_BYTES = size_t(8) << 20;
constexpr size_t BUFFER_ALIGN = 8;

// The trace file and the kernel-name table. CUPTI may complete buffers on its own thread while
// the process flushes at exit, so both are used under the mutex.
struct trace_file {
    std::mutex                                mutex;
    FILE *                                    out = nullptr;
    std::unordered_map<std::string, unsigned> names;
    size_t                                    dropped = 0;
};

trace_file & trace() {
    static trace_file t;
    return t;
}

const char * copy_kind_name(uint8_t kind) {
    switch (kind) {
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
        case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
        default:                              return "other";
    }
}

// Caller holds the mutex.
unsigned name_id(trace_file & t, const char * name) {
    const std::string key = name ? name : "?";
    const auto        it  = t.names.find(key);
    if (it != t.names.end()) {
        return it->second;
    }
    const unsigned id = (unsigned) t.names.size();
    t.names.emplace(key, id);
    std::fprintf(t.out, "n %u %s\n", id, key.c_str());
    return id;
}

// Caller holds the mutex.
void write_record(trace_file & t, const CUpti_Activity * record) {
    switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            const auto *   k  = (const CUpti_ActivityKernel10 *) record;
            const unsigned id = name_id(t, k->name);
            std::fprintf(t.out, "k %u %llu %llu %u %u %u %u %d %d %d %d %d %d\n", id, (unsigned long long) k->start,
                         (unsigned long long) k->end, k->deviceId, k->streamId, k->correlationId, k->graphId, k->gridX,
                         k->gridY, k->gridZ, k->blockX, k->blockY, k->blockZ);
        } break;
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            const auto * m = (const CUpti_ActivityMemcpy6 *) record;
            std::fprintf(t.out, "m %s %llu %llu %llu %u %u %u %u\n", copy_kind_name(m->copyKind),
                         (unsigned long long) m->bytes, (unsigned long long) m->start, (unsigned long long) m->end,
                         m->deviceId, m->streamId, m->correlationId, m->graphId);
        } break;
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            const auto * s = (const CUpti_ActivityMemset4 *) record;
            std::fprintf(t.out, "s %llu %llu %llu %u %u %u %u\n", (unsigned long long) s->bytes,
                         (unsigned long long) s->start, (unsigned long long) s->end, s->deviceId, s->streamId,
                         s->correlationId, s->graphId);
        } break;
        case CUPTI_ACTIVITY_KIND_RUNTIME: {
            const auto * a    = (const CUpti_ActivityAPI *) record;
            const char * name = nullptr;
            if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS) {
                name = nullptr;
            }
            const unsigned id = name_id(t, name);
            std::fprintf(t.out, "a %u %llu %llu %u %u\n", id, (unsigned long long) a->start,
                         (unsigned long long) a->end, a->threadId, a->correlationId);
        } break;
        case CUPTI_ACTIVITY_KIND_GRAPH_TRACE: {
            const auto * g = (const CUpti_ActivityGraphTrace2 *) record;
            std::fprintf(t.out, "g %llu %llu %u %u %u %u\n", (unsigned long long) g->start,
                         (unsigned long long) g->end, g->deviceId, g->streamId, g->correlationId, g->graphId);
        } break;
        default:
            break;
    }
}

void CUPTIAPI buffer_requested(uint8_t ** buffer, size_t * size, size_t * max_records) {
    void * p = nullptr;
    if (posix_memalign(&p, BUFFER_ALIGN, BUFFER_BYTES) != 0) {
        std::fprintf(stderr, "flashrt-cupti-trace: out of memory for a %zu-byte activity buffer\n", BUFFER_BYTES);
        std::_Exit(3);
    }
    *buffer      = (uint8_t *) p;
    *size        = BUFFER_BYTES;
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t * buffer, size_t, size_t valid) {
    trace_file &                t = trace();
    std::lock_guard<std::mutex> lock(t.mutex);
    CUpti_Activity *            record = nullptr;
    for (;;) {
        const CUptiResult res = cuptiActivityGetNextRecord(buffer, valid, &record);
        if (res == CUPTI_ERROR_MAX_LIMIT_REACHED) {
            break;
        }
        CUPTI_CHECK(res);
        if (t.out) {
            write_record(t, record);
        }
    }
    size_t dropped = 0;
    CUPTI_CHECK(cuptiActivityGetNumDroppedRecords(context, stream, &dropped));
    t.dropped += dropped;
    std::free(buffer);
}

void flush_at_exit() {
    // Delivers what is still in CUPTI's buffers through buffer_completed, then closes the file;
    // the end marker only when everything was delivered.
    const CUptiResult           flushed = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    trace_file &                t       = trace();
    std::lock_guard<std::mutex> lock(t.mutex);
    if (!t.out) {
        return;
    }
    if (flushed != CUPTI_SUCCESS) {
        const char * what = nullptr;
        cuptiGetResultString(flushed, &what);
        std::fprintf(stderr, "flashrt-cupti-trace: flushing at exit failed: %s\n", what ? what : "?");
    } else {
        if (t.dropped > 0) {
            std::fprintf(t.out, "d %zu\n", t.dropped);
        }
        std::fprintf(t.out, "e\n");
    }
    std::fclose(t.out);
    t.out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection(void) {
    const char * path  = std::getenv("FRT_CUPTI_TRACE");
    const char * level = std::getenv("FRT_CUPTI_LEVEL");
    const bool   graphs = level && std::string(level) == "graphs";
    if (level && *level && !graphs && std::string(level) != "kernels") {
        std::fprintf(stderr, "flashrt-cupti-trace: FRT_CUPTI_LEVEL=%s: use kernels (the default) or graphs\n", level);
        std::_Exit(3);
    }
    if (!path || !*path) {
        std::fprintf(stderr, "flashrt-cupti-trace: set FRT_CUPTI_TRACE to the file to write the trace to\n");
        std::_Exit(3);
    }
    trace_file & t = trace();
    {
        std::lock_guard<std::mutex> lock(t.mutex);
        t.out = std::fopen(path, "w");
        if (!t.out) {
            std::fprintf(stderr, "flashrt-cupti-trace: cannot write %s\n", path);
            std::_Exit(3);
        }
        std::fprintf(t.out, "# flashrt-cupti-trace 1\n");
    }
    CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    // CUPTI refuses graph-level records beside kernel records: one level a run.
    CUPTI_CHECK(cuptiActivityEnable(graphs ? CUPTI_ACTIVITY_KIND_GRAPH_TRACE : CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    if (graphs) {
        CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
    }
    CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
    CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
    std::atexit(flush_at_exit);
    return 1;
}
