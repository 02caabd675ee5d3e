/* SPDX-License-Identifier: MIT */
/* Structured output (private to src/control): response_format's JSON schemas,
 * and json_object, turned into a constraint on every draw of a request, so
 * that what the model writes parses and matches the schema.
 *
 * The grammar engine is llguidance (Microsoft's, MIT; what llama.cpp, vLLM
 * and SGLang use), called through its C API. It ships on PyPI only as the
 * Python wheel `llguidance`, whose shared library exports that C API beside
 * its Python module; scripts/deps.sh installs the wheel into the project's
 * .venv and the library is loaded at the first structured request (dlopen):
 * $MEGASCOPE_LLGUIDANCE names the file, else the .venv next to the binary or
 * the source tree is searched. The library is linked against no Python but
 * refers to its symbols, so the shared libpython3 (Debian's libpython3-dev)
 * is loaded first, global, and never initialised: no Python code runs.
 *
 * A schema is compiled once into a matcher that is kept (at most
 * SO_CACHE_SCHEMAS, least recently used out) and cloned for each choice.
 * Before each draw the choice's matcher takes the tokens drawn since, then
 * writes the mask of tokens that may follow (one bit a token) and the others'
 * logits become -INFINITY. Once the schema is complete only the end tokens
 * (the template's end of turn, the model's EOS) are allowed. */
#ifndef MS_CONTROL_STRUCTURED_H
#define MS_CONTROL_STRUCTURED_H

#include <stddef.h>
#include <stdint.h>

#define SO_CACHE_SCHEMAS 64

struct ms_tokenizer;
struct so_engine;
struct so_schema;

/* The engine for one model: vocab ids, eos the end the grammar allows
 * (the end of turn, or the model's EOS), eos2 another (-1: none). Loads
 * nothing yet. NULL + errno. */
struct so_engine *so_engine_new(const struct ms_tokenizer *tok, int vocab, int eos, int eos2);
void so_engine_free(struct so_engine *se);

/* The compiled schema for kind ("json_object", "json_schema") and data (the
 * schema's JSON text; NULL for json_object), from the cache or compiled now
 * (loading llguidance at the first call). NULL with the reason in msg
 * (*unavailable = 1 when llguidance could not be loaded: a 501, not the
 * schema's fault). The caller holds a reference: so_schema_put. */
struct so_schema *so_schema_get(struct so_engine *se, const char *kind, const char *data, char *msg, size_t msg_n,
                                int *unavailable);
void so_schema_put(struct so_schema *s);

/* A choice's constraint, for ms_request_opts.constrain, constrain_free and
 * constrain_user; NULL + errno. */
void *so_constraint_new(struct so_schema *s);
void so_constrain(void *user, const int32_t *tokens, int n, float *logits, int vocab);
void so_constraint_free(void *user);

/* "llguidance@1.8.0 ..." once loaded, else NULL. */
const char *so_version(struct so_engine *se);

#endif
