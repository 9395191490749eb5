// The logits of every position of a text, decoded one token per llama_decode call (teacher
// forcing), written as float32 for `cargo xtask parity` to compare between runs. One token per
// call because decode is the path most of the overlay's windows target; PROMPT > 0 first feeds
// that many tokens in one call (a prefill, every position's logits kept), for the windows that take
// prompts. Flash attention on, as in bench. Built by xtask against the build under test, using
// only the public llama.h API.
//
// Usage: flashrt-logits MODEL TEXT N OUT [N_GPU_LAYERS [PROMPT]]   (defaults 99 and 0)
//
// OUT, little-endian: "FRTLOGITS" (9 bytes), int32 version (1), int32 n_vocab, int32 n_tokens,
// then n_tokens int32 token ids, then n_tokens x n_vocab float32 logits (row p: the logits after
// feeding tokens 0..p).
//
// The CPU's extra buffer types (repacked weight layouts) are always off: with every layer on the
// GPU they hold nothing, and on CPU-only runs the AMX repack path of some x86 machines crashes.

#include "llama.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr char    k_magic[]  = "FRTLOGITS";
constexpr int32_t k_version  = 1;
// Room above N in the context: a few cells of padding that some memory layouts round up to.
constexpr int32_t k_ctx_slack = 16;

struct model_deleter {
    void operator()(llama_model * m) const { llama_model_free(m); }
};

struct context_deleter {
    void operator()(llama_context * c) const { llama_free(c); }
};

struct file_closer {
    void operator()(FILE * f) const { std::fclose(f); }
};

[[noreturn]] void fail(const std::string & message) {
    std::fprintf(stderr, "flashrt-logits: %s\n", message.c_str());
    std::exit(1);
}

bool parse_int(const char * text, long min, long max, long & out) {
    char * end = nullptr;
    errno      = 0;
    const long v = std::strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max) {
        return false;
    }
    out = v;
    return true;
}

// Appends little-endian bytes whatever the machine's byte order.
void put_u32(std::vector<unsigned char> & buf, uint32_t v) {
    for (int i = 0; i < 4; ++i) {
        buf.push_back(static_cast<unsigned char>(v >> (8 * i)));
    }
}

void put_f32(std::vector<unsigned char> & buf, float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    put_u32(buf, bits);
}

void write_all(FILE * f, const std::vector<unsigned char> & buf, const std::string & path) {
    if (std::fwrite(buf.data(), 1, buf.size(), f) != buf.size()) {
        fail("writing " + path + ": " + std::strerror(errno));
    }
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 5 || argc > 7) {
        std::fprintf(stderr,
                     "usage: %s MODEL TEXT N OUT [N_GPU_LAYERS [PROMPT]]\n"
                     "  writes the float32 logits of the first N tokens of TEXT, one llama_decode per token\n"
                     "  after the first PROMPT tokens, which go in one llama_decode (default 0)\n",
                     argc > 0 ? argv[0] : "flashrt-logits");
        return 2;
    }
    const std::string model_path = argv[1];
    const std::string text_path  = argv[2];
    const std::string out_path   = argv[4];
    long              n_tokens   = 0;
    long              n_gpu      = 99;
    long              n_prompt   = 0;
    if (!parse_int(argv[3], 1, 1 << 20, n_tokens)) {
        fail(std::string("N must be a positive integer, got \"") + argv[3] + "\"");
    }
    if (argc >= 6 && !parse_int(argv[5], -1, 1 << 20, n_gpu)) {
        fail(std::string("N_GPU_LAYERS must be an integer >= -1, got \"") + argv[5] + "\"");
    }
    if (argc == 7 && !parse_int(argv[6], 0, n_tokens, n_prompt)) {
        fail(std::string("PROMPT must be an integer from 0 to N, got \"") + argv[6] + "\"");
    }

    std::ifstream text_file(text_path, std::ios::binary);
    if (!text_file) {
        fail("cannot read the text " + text_path);
    }
    std::stringstream text_stream;
    text_stream << text_file.rdbuf();
    const std::string text = text_stream.str();

    ggml_backend_load_all();
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers       = static_cast<int32_t>(n_gpu);
    mparams.use_extra_bufts    = false;
    std::unique_ptr<llama_model, model_deleter> model(llama_model_load_from_file(model_path.c_str(), mparams));
    if (!model) {
        fail("cannot load the model " + model_path + " (see the log above)");
    }
    const llama_vocab * vocab   = llama_model_get_vocab(model.get());
    const int32_t       n_vocab = llama_vocab_n_tokens(vocab);

    // BOS (and other special tokens) as the vocabulary asks for them; a first call sizes the list.
    if (text.size() > static_cast<size_t>(INT32_MAX)) {
        fail(text_path + " is too large to tokenize");
    }
    const int32_t text_len = static_cast<int32_t>(text.size());
    const int32_t counted  = llama_tokenize(vocab, text.data(), text_len, nullptr, 0, true, false);
    if (counted == INT32_MIN || counted > 0) {
        fail("cannot tokenize " + text_path);
    }
    const int32_t n_text = -counted;
    std::vector<llama_token> tokens(static_cast<size_t>(n_text));
    if (llama_tokenize(vocab, text.data(), text_len, tokens.data(), n_text, true, false) != n_text) {
        fail("cannot tokenize " + text_path);
    }
    if (n_text < n_tokens) {
        fail(text_path + " has " + std::to_string(n_text) + " tokens, fewer than the " + std::to_string(n_tokens) +
             " asked for: use a longer text or a smaller N");
    }
    tokens.resize(static_cast<size_t>(n_tokens));

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx                = static_cast<uint32_t>(n_tokens + k_ctx_slack);
    // One token per call: a small batch keeps the reserved compute buffers small. The prompt goes in
    // one micro-batch, as a prefill of that length does in llama-bench (up to its default of 512).
    cparams.n_batch              = static_cast<uint32_t>(std::max(64L, n_prompt));
    cparams.n_ubatch             = cparams.n_batch;
    cparams.n_seq_max            = 1;
    cparams.flash_attn_type      = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    cparams.no_perf              = true;
    const int32_t threads        = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    cparams.n_threads            = threads;
    cparams.n_threads_batch      = threads;
    std::unique_ptr<llama_context, context_deleter> ctx(llama_init_from_model(model.get(), cparams));
    if (!ctx) {
        fail("cannot create a context of " + std::to_string(cparams.n_ctx) + " tokens (see the log above)");
    }

    std::unique_ptr<FILE, file_closer> out(std::fopen(out_path.c_str(), "wb"));
    if (!out) {
        fail("cannot create " + out_path + ": " + std::strerror(errno));
    }
    std::vector<unsigned char> buf(k_magic, k_magic + std::strlen(k_magic));
    put_u32(buf, static_cast<uint32_t>(k_version));
    put_u32(buf, static_cast<uint32_t>(n_vocab));
    put_u32(buf, static_cast<uint32_t>(n_tokens));
    for (const llama_token t : tokens) {
        put_u32(buf, static_cast<uint32_t>(t));
    }
    write_all(out.get(), buf, out_path);

    const auto write_logits = [&](int32_t ith, long pos) {
        const float * logits = llama_get_logits_ith(ctx.get(), ith);
        if (logits == nullptr) {
            fail("no logits at position " + std::to_string(pos));
        }
        buf.clear();
        for (int32_t i = 0; i < n_vocab; ++i) {
            put_f32(buf, logits[i]);
        }
        write_all(out.get(), buf, out_path);
    };
    if (n_prompt > 0) {
        llama_batch batch = llama_batch_init(static_cast<int32_t>(n_prompt), 0, 1);
        for (long p = 0; p < n_prompt; ++p) {
            batch.token[p]     = tokens[static_cast<size_t>(p)];
            batch.pos[p]       = static_cast<llama_pos>(p);
            batch.n_seq_id[p]  = 1;
            batch.seq_id[p][0] = 0;
            batch.logits[p]    = 1;
        }
        batch.n_tokens   = static_cast<int32_t>(n_prompt);
        const int32_t rc = llama_decode(ctx.get(), batch);
        llama_batch_free(batch);
        if (rc != 0) {
            fail("llama_decode failed with " + std::to_string(rc) + " on the prompt of " + std::to_string(n_prompt) +
                 " tokens");
        }
        for (long p = 0; p < n_prompt; ++p) {
            write_logits(static_cast<int32_t>(p), p);
        }
    }
    for (long pos = n_prompt; pos < n_tokens; ++pos) {
        llama_batch   batch = llama_batch_get_one(&tokens[static_cast<size_t>(pos)], 1);
        const int32_t rc    = llama_decode(ctx.get(), batch);
        if (rc != 0) {
            fail("llama_decode failed with " + std::to_string(rc) + " at position " + std::to_string(pos));
        }
        write_logits(-1, pos);
    }

    FILE * raw = out.release();
    if (std::fflush(raw) != 0 || std::fclose(raw) != 0) {
        fail("writing " + out_path + ": " + std::strerror(errno));
    }
    std::printf("%s: %ld positions x %d logits\n", out_path.c_str(), n_tokens, n_vocab);
    ctx.reset();
    model.reset();
    llama_backend_free();
    return 0;
}
