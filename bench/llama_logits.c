// llama-logits: llama.cpp's full next-token logits at every position of token-id sequences.
//
//     llama-logits MODEL.gguf N_CTX N_THREADS
//
// Compiled against the libllama of `python -m bench.llamacpp build` and driven by
// bench/llama_logits.py over pipes. Once the model is loaded it writes n_vocab (int32) to
// stdout; then, for each request on stdin (int32 n, then n int32 token ids), it evaluates the
// sequence from an empty KV cache (llama.cpp's default context settings otherwise) and writes
// n * n_vocab float32 logits, row i being the distribution after token i. EOF on stdin ends it.
// Errors go to stderr with a non-zero exit.

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

static void errors_only(enum ggml_log_level level, const char *text, void *user_data) {
    (void)user_data;
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static int read_exact(void *buf, size_t size) {
    return fread(buf, 1, size, stdin) == size;
}

static int fail(const char *what) {
    fprintf(stderr, "llama-logits: %s\n", what);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf N_CTX N_THREADS\n", argv[0]);
        return 2;
    }
    const int n_ctx = atoi(argv[2]);
    const int n_threads = atoi(argv[3]);
    if (n_ctx < 1 || n_threads < 1) {
        return fail("N_CTX and N_THREADS must be positive");
    }
    llama_log_set(errors_only, NULL);
    llama_backend_init();

    struct llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (model == NULL) {
        return fail("cannot load the model");
    }
    struct llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = (uint32_t)n_ctx;
    cparams.n_batch = (uint32_t)n_ctx;  // a whole sequence per llama_decode call
    cparams.n_seq_max = 1;
    cparams.n_threads = n_threads;
    cparams.n_threads_batch = n_threads;
    cparams.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, cparams);
    if (ctx == NULL) {
        return fail("cannot create a context");
    }
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    fwrite(&n_vocab, sizeof n_vocab, 1, stdout);
    fflush(stdout);

    struct llama_batch batch = llama_batch_init(n_ctx, 0, 1);
    int32_t n;
    while (read_exact(&n, sizeof n)) {
        if (n < 1 || n > n_ctx) {
            return fail("a sequence must hold 1..N_CTX tokens");
        }
        if (!read_exact(batch.token, (size_t)n * sizeof(llama_token))) {
            return fail("stdin ended inside a sequence");
        }
        for (int32_t i = 0; i < n; i++) {
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        batch.n_tokens = n;
        llama_memory_clear(llama_get_memory(ctx), true);
        if (llama_decode(ctx, batch) != 0) {
            return fail("llama_decode failed (a token id out of range?)");
        }
        for (int32_t i = 0; i < n; i++) {
            const float *row = llama_get_logits_ith(ctx, i);
            if (row == NULL || fwrite(row, sizeof(float), (size_t)n_vocab, stdout) != (size_t)n_vocab) {
                return fail("cannot write the logits");
            }
        }
        fflush(stdout);
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
