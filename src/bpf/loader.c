/* SPDX-License-Identifier: MIT */
/* The ELF loader: objects from `clang -O2 -g -target bpf -c`, written with
 * libbpf's bpf_helpers.h and BTF-defined maps, read without any kernel.
 *
 * Who does what:
 *  - libelf, here: a structural check of the whole file before anything else
 *    reads it (class, machine, byte order, every section inside the file,
 *    symbol and relocation tables well-formed, every relocation inside its
 *    section and naming an existing symbol), so that neither libbpf nor the
 *    code below ever follows an offset that points outside the buffer; and
 *    btf_check.c on .BTF, whose type references libbpf 1.1 trusts (bit-flipped
 *    BTF crashed it in our fuzzing before that check existed).
 *  - libbpf (bpf_object__open_mem, nothing loaded): BTF-defined map
 *    definitions (type, key/value size, max_entries, flags), the global-data
 *    maps (.rodata/.data/.bss with initial values) and the list of entry
 *    programs with their sections.
 *  - by hand, because libbpf applies relocations only while loading into a
 *    kernel (bpf_object__load): reading the .rel<section> tables, rewriting
 *    each map reference to lddw MAP_FD/MAP_VALUE with imm = the map's index,
 *    and linking bpf-to-bpf calls (each called subprogram appended once after
 *    the program, call offsets fixed).
 * Every refusal names what and where (section, instruction, symbol). */
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bpf/libbpf.h>

#include "bpf/bpf_internal.h"

#ifndef EM_BPF
#define EM_BPF 247
#endif
#define R_BPF_64_64 1
#define R_BPF_64_32 10

struct section {
  char *name;
  GElf_Shdr shdr;
  const uint8_t *data; /* NULL for NOBITS */
  size_t size;
};

struct reloc {
  uint64_t offset;
  uint32_t sym;
  uint32_t type;
};

struct sec_relocs {
  struct reloc *r;
  size_t n;
};

struct ms_bpf_object {
  char *license;
  uint8_t *image; /* the owned copy of the file */
  size_t image_size;
  struct section *secs;
  size_t n_secs;
  struct ms_bpf_map_def *maps;
  size_t n_maps;
  uint8_t **map_init; /* initial values of global-data maps, or NULL */
  size_t *map_init_size;
  struct ms_bpf_prog **progs;
  size_t n_progs;
};

/* Everything the loading steps share. */
struct load {
  struct ms_bpf_object *o;
  struct ms_textbuf *log;
  Elf *elf;
  size_t symtab; /* section index, 0 when none */
  GElf_Sym *syms;
  size_t n_syms;
  size_t maps_sec; /* index of .maps, 0 when none */
  struct sec_relocs *relocs; /* by section index */
  const char **map_secs; /* for each map: the ELF section of a global-data map, else NULL */
};

__attribute__((format(printf, 2, 3))) static int refuse(struct load *l, const char *fmt, ...) {
  char msg[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ms_textbuf_printf(l->log, "%s\n", msg);
  return -MS_E_FORMAT;
}

/* ---- libbpf's messages go to the caller's log --------------------------- */

static _Thread_local struct ms_textbuf *libbpf_log;
static pthread_once_t libbpf_once = PTHREAD_ONCE_INIT;

static int libbpf_print(enum libbpf_print_level level, const char *fmt, va_list ap) {
  if (level != LIBBPF_WARN || !libbpf_log) return 0; /* its info lines are chatter */
  char msg[300];
  vsnprintf(msg, sizeof msg, fmt, ap);
  ms_textbuf_printf(libbpf_log, "%s", msg);
  return 0;
}

static void libbpf_setup(void) {
  libbpf_set_print(libbpf_print);
  elf_version(EV_CURRENT);
}

/* ---- the structural check (libelf) -------------------------------------- */

static const char *sec_name(const struct load *l, size_t i) {
  return i < l->o->n_secs && l->o->secs[i].name ? l->o->secs[i].name : "?";
}

static int is_exec(const struct section *s) {
  return s->shdr.sh_type == SHT_PROGBITS && (s->shdr.sh_flags & SHF_EXECINSTR);
}

static int check_header(struct load *l) {
  GElf_Ehdr eh;
  if (elf_kind(l->elf) != ELF_K_ELF) return refuse(l, "not an ELF file");
  if (!gelf_getehdr(l->elf, &eh)) return refuse(l, "ELF header: %s", elf_errmsg(-1));
  if (eh.e_ident[EI_CLASS] != ELFCLASS64) return refuse(l, "ELF header: not a 64-bit object");
  if (eh.e_ident[EI_DATA] != ELFDATA2LSB) return refuse(l, "ELF header: not little-endian");
  if (eh.e_machine != EM_BPF) return refuse(l, "ELF header: machine %u is not BPF (247)", eh.e_machine);
  if (eh.e_type != ET_REL) return refuse(l, "ELF header: type %u is not a relocatable object", eh.e_type);
  return 0;
}

static int read_sections(struct load *l) {
  size_t n, strndx;
  if (elf_getshdrnum(l->elf, &n) || elf_getshdrstrndx(l->elf, &strndx))
    return refuse(l, "section table: %s", elf_errmsg(-1));
  if (n == 0 || n > 65535) return refuse(l, "section table: %zu sections", n);
  l->o->secs = calloc(n, sizeof *l->o->secs);
  l->relocs = calloc(n, sizeof *l->relocs);
  if (!l->o->secs || !l->relocs) return -ENOMEM;
  l->o->n_secs = n;
  for (size_t i = 1; i < n; i++) {
    struct section *s = &l->o->secs[i];
    Elf_Scn *scn = elf_getscn(l->elf, i);
    if (!scn || !gelf_getshdr(scn, &s->shdr)) return refuse(l, "section %zu: unreadable header", i);
    const char *name = elf_strptr(l->elf, strndx, s->shdr.sh_name);
    if (!name) return refuse(l, "section %zu: name offset %u outside the string table", i, s->shdr.sh_name);
    if (!(s->name = strdup(name))) return -ENOMEM;
    if (s->shdr.sh_type == SHT_NOBITS) continue;
    if (s->shdr.sh_offset > l->o->image_size || s->shdr.sh_size > l->o->image_size - s->shdr.sh_offset)
      return refuse(l, "section %zu (%s): offset 0x%llx + size 0x%llx is beyond the file's 0x%zx bytes", i,
                    s->name, (unsigned long long)s->shdr.sh_offset, (unsigned long long)s->shdr.sh_size,
                    l->o->image_size);
    s->data = l->o->image + s->shdr.sh_offset;
    s->size = s->shdr.sh_size;
    if (is_exec(s) && s->size % 8)
      return refuse(l, "section %zu (%s): %zu bytes is not a whole number of instructions", i, s->name, s->size);
    if (s->shdr.sh_type == SHT_SYMTAB) {
      if (l->symtab) return refuse(l, "section %zu (%s): a second symbol table", i, s->name);
      l->symtab = i;
    }
    if (!strcmp(s->name, ".maps")) l->maps_sec = i;
    if (s->shdr.sh_type == SHT_RELA) return refuse(l, "section %zu (%s): RELA relocations (BPF uses REL)", i, s->name);
  }
  return 0;
}

static int read_symbols(struct load *l) {
  if (!l->symtab) return refuse(l, "no symbol table");
  const struct section *st = &l->o->secs[l->symtab];
  size_t strtab = st->shdr.sh_link;
  if (st->shdr.sh_entsize != sizeof(Elf64_Sym) || st->size % sizeof(Elf64_Sym))
    return refuse(l, "symbol table (section %zu): entry size %llu", l->symtab, (unsigned long long)st->shdr.sh_entsize);
  if (strtab == 0 || strtab >= l->o->n_secs || l->o->secs[strtab].shdr.sh_type != SHT_STRTAB)
    return refuse(l, "symbol table (section %zu): its string table %zu is not one", l->symtab, strtab);
  l->n_syms = st->size / sizeof(Elf64_Sym);
  l->syms = calloc(l->n_syms ? l->n_syms : 1, sizeof *l->syms);
  if (!l->syms) return -ENOMEM;
  Elf_Data *d = elf_getdata(elf_getscn(l->elf, l->symtab), NULL);
  for (size_t i = 0; i < l->n_syms; i++) {
    GElf_Sym *s = &l->syms[i];
    if (!d || !gelf_getsym(d, (int)i, s)) return refuse(l, "symbol %zu: unreadable", i);
    if (!elf_strptr(l->elf, strtab, s->st_name)) return refuse(l, "symbol %zu: name outside the string table", i);
    if (s->st_shndx >= l->o->n_secs && s->st_shndx < SHN_LORESERVE)
      return refuse(l, "symbol %zu: section index %u out of range", i, s->st_shndx);
    if (GELF_ST_TYPE(s->st_info) == STT_FUNC && s->st_shndx < l->o->n_secs) {
      const struct section *sec = &l->o->secs[s->st_shndx];
      if (!is_exec(sec) || s->st_value % 8 || s->st_size % 8 || s->st_value > sec->size ||
          s->st_size > sec->size - s->st_value)
        return refuse(l, "function symbol %zu (%s): [0x%llx, +0x%llx) is not inside code section %s", i,
                      elf_strptr(l->elf, strtab, s->st_name), (unsigned long long)s->st_value,
                      (unsigned long long)s->st_size, sec_name(l, s->st_shndx));
    }
  }
  return 0;
}

static const char *sym_name(const struct load *l, uint32_t i) {
  const char *n = elf_strptr(l->elf, l->o->secs[l->symtab].shdr.sh_link, l->syms[i].st_name);
  return n && *n ? n : sec_name(l, l->syms[i].st_shndx);
}

static int cmp_reloc(const void *a, const void *b) {
  const struct reloc *x = a, *y = b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Reads the REL table of section i if it relocates code. */
static int read_relocs(struct load *l, size_t i) {
  const struct section *s = &l->o->secs[i];
  size_t target = s->shdr.sh_info;
  if (s->shdr.sh_type != SHT_REL) return 0;
  if (target == 0 || target >= l->o->n_secs) return refuse(l, "section %zu (%s): relocates section %zu, out of range", i, s->name, target);
  if (!is_exec(&l->o->secs[target])) return 0; /* .rel.BTF, .rel.BTF.ext: debug info only */
  if (s->shdr.sh_link != l->symtab) return refuse(l, "section %zu (%s): not linked to the symbol table", i, s->name);
  if (s->shdr.sh_entsize != sizeof(Elf64_Rel) || s->size % sizeof(Elf64_Rel))
    return refuse(l, "section %zu (%s): relocation entry size %llu", i, s->name, (unsigned long long)s->shdr.sh_entsize);
  struct sec_relocs *sr = &l->relocs[target];
  if (sr->r) return refuse(l, "section %zu (%s): a second relocation table for %s", i, s->name, sec_name(l, target));
  size_t n = s->size / sizeof(Elf64_Rel);
  sr->r = calloc(n ? n : 1, sizeof *sr->r);
  if (!sr->r) return -ENOMEM;
  Elf_Data *d = elf_getdata(elf_getscn(l->elf, i), NULL);
  size_t code_size = l->o->secs[target].size;
  for (size_t k = 0; k < n; k++) {
    GElf_Rel rel;
    if (!d || !gelf_getrel(d, (int)k, &rel)) return refuse(l, "section %s: relocation %zu unreadable", s->name, k);
    struct reloc *r = &sr->r[sr->n++];
    r->offset = rel.r_offset;
    r->sym = (uint32_t)GELF_R_SYM(rel.r_info);
    r->type = (uint32_t)GELF_R_TYPE(rel.r_info);
    if (r->offset % 8 || r->offset >= code_size)
      return refuse(l, "section %s: relocation %zu at offset 0x%llx is outside the %zu instructions of %s",
                    s->name, k, (unsigned long long)r->offset, code_size / 8, sec_name(l, target));
    if (r->sym == 0 || r->sym >= l->n_syms)
      return refuse(l, "section %s: relocation %zu names symbol %u, out of range", s->name, k, r->sym);
    if (r->type != R_BPF_64_64 && r->type != R_BPF_64_32)
      return refuse(l, "section %s: relocation %zu has type %u (only R_BPF_64_64 and R_BPF_64_32)", s->name, k, r->type);
  }
  qsort(sr->r, sr->n, sizeof *sr->r, cmp_reloc);
  return 0;
}

static int check_elf(struct load *l) {
  int err = check_header(l);
  if (!err) err = read_sections(l);
  if (!err) err = read_symbols(l);
  for (size_t i = 1; !err && i < l->o->n_secs; i++) err = read_relocs(l, i);
  size_t btf_size;
  const void *btf = err ? NULL : ms_bpf_object_section(l->o, ".BTF", &btf_size);
  if (btf) err = ms_bpf_btf_check(btf, btf_size, l->log);
  return err;
}

/* ---- maps and programs from libbpf -------------------------------------- */

static int supported_map_type(uint32_t t) {
  return t == MS_BPF_MAP_HASH || t == MS_BPF_MAP_ARRAY || t == MS_BPF_MAP_PERCPU_HASH ||
         t == MS_BPF_MAP_PERCPU_ARRAY || t == MS_BPF_MAP_RINGBUF;
}

/* The ELF data section a global-data map stands for: libbpf names it after
 * the section (".rodata.str1.1") or "<object prefix>.rodata"; the longest
 * section name the map's name ends with is the one. */
static const char *data_section_of(const struct load *l, const char *map_name) {
  const char *best = NULL;
  size_t nl = strlen(map_name), bl = 0;
  for (size_t i = 1; i < l->o->n_secs; i++) {
    const char *s = l->o->secs[i].name;
    size_t sl = strlen(s);
    if (s[0] == '.' && sl <= nl && sl > bl && !strcmp(map_name + nl - sl, s)) best = s, bl = sl;
  }
  return best;
}

static int take_maps(struct load *l, struct bpf_object *bo) {
  struct bpf_map *m;
  size_t n = 0;
  bpf_object__for_each_map(m, bo) n++;
  if (n > MS_BPF_MAX_MAPS) return refuse(l, "%zu maps, a program may name at most %d", n, MS_BPF_MAX_MAPS);
  struct ms_bpf_object *o = l->o;
  o->maps = calloc(n + 1, sizeof *o->maps);
  o->map_init = calloc(n + 1, sizeof *o->map_init);
  o->map_init_size = calloc(n + 1, sizeof *o->map_init_size);
  l->map_secs = calloc(n + 1, sizeof *l->map_secs);
  if (!o->maps || !o->map_init || !o->map_init_size || !l->map_secs) return -ENOMEM;
  bpf_object__for_each_map(m, bo) {
    struct ms_bpf_map_def *d = &o->maps[o->n_maps];
    snprintf(d->name, sizeof d->name, "%s", bpf_map__name(m));
    d->type = (uint32_t)bpf_map__type(m);
    d->key_size = bpf_map__key_size(m);
    d->value_size = bpf_map__value_size(m);
    d->max_entries = bpf_map__max_entries(m);
    d->flags = bpf_map__map_flags(m) & MS_BPF_MAP_F_RDONLY_PROG;
    if (!supported_map_type(d->type))
      return refuse(l, "map '%s': type %u is not supported (hash 1, array 2, percpu hash 5, percpu array 6, ringbuf 27)",
                    d->name, d->type);
    if (bpf_map__is_internal(m)) {
      if (d->value_size > 65536)  /* a monitor's global data is small: a larger claim is hostile */
        return refuse(l, "map '%s': %u bytes of global data (at most 65536)", d->name, d->value_size);
      const char *sec = data_section_of(l, d->name);
      if (!sec) return refuse(l, "map '%s': global data whose section is unknown (externs and .kconfig are not supported)", d->name);
      l->map_secs[o->n_maps] = sec;
      size_t size = 0;
      const void *init = bpf_map__initial_value(m, &size);
      if (init && size) {
        o->map_init[o->n_maps] = malloc(size);
        if (!o->map_init[o->n_maps]) return -ENOMEM;
        memcpy(o->map_init[o->n_maps], init, size);
        o->map_init_size[o->n_maps] = size;
      }
    }
    o->n_maps++;
  }
  return 0;
}

/* ---- relocation and linking --------------------------------------------- */

struct origin {
  uint32_t sec;
  uint32_t idx; /* instruction index in that section */
};

struct func {
  uint32_t sec, start, len; /* instructions */
  size_t base;              /* where it starts in the output */
};

struct link {
  struct ms_bpf_insn *out;
  struct origin *from;
  size_t n, cap;
  struct func *funcs;
  size_t n_funcs, cap_funcs;
  const char *prog;
};

static const struct reloc *find_reloc(const struct load *l, uint32_t sec, uint32_t idx) {
  const struct sec_relocs *sr = &l->relocs[sec];
  struct reloc key = {.offset = (uint64_t)idx * 8};
  return sr->n ? bsearch(&key, sr->r, sr->n, sizeof *sr->r, cmp_reloc) : NULL;
}

/* The function symbol of section sec that covers instruction idx. */
static int find_func(const struct load *l, uint32_t sec, uint32_t idx, struct func *f) {
  for (size_t i = 0; i < l->n_syms; i++) {
    const GElf_Sym *s = &l->syms[i];
    if (GELF_ST_TYPE(s->st_info) != STT_FUNC || s->st_shndx != sec || !s->st_size) continue;
    if (idx >= s->st_value / 8 && idx < (s->st_value + s->st_size) / 8) {
      *f = (struct func){sec, (uint32_t)(s->st_value / 8), (uint32_t)(s->st_size / 8), 0};
      return 0;
    }
  }
  return -1;
}

static int append_func(struct load *l, struct link *k, struct func f, size_t *base) {
  for (size_t i = 0; i < k->n_funcs; i++)
    if (k->funcs[i].sec == f.sec && k->funcs[i].start == f.start) {
      *base = k->funcs[i].base;
      return 0;
    }
  if (k->n + f.len > MS_BPF_MAX_INSNS)
    return refuse(l, "program %s: more than %d instructions once linked", k->prog, MS_BPF_MAX_INSNS);
  if (k->n + f.len > k->cap) {
    size_t cap = (k->n + f.len) * 2;
    struct ms_bpf_insn *o = realloc(k->out, cap * sizeof *o);
    if (o) k->out = o;
    struct origin *fr = realloc(k->from, cap * sizeof *fr);
    if (fr) k->from = fr;
    if (!o || !fr) return -ENOMEM;
    k->cap = cap;
  }
  if (k->n_funcs == k->cap_funcs) {
    size_t cap = k->cap_funcs ? k->cap_funcs * 2 : 8;
    struct func *fs = realloc(k->funcs, cap * sizeof *fs);
    if (!fs) return -ENOMEM;
    k->funcs = fs;
    k->cap_funcs = cap;
  }
  f.base = k->n;
  k->funcs[k->n_funcs++] = f;
  memcpy(k->out + k->n, l->o->secs[f.sec].data + (size_t)f.start * 8, (size_t)f.len * 8);
  for (uint32_t i = 0; i < f.len; i++) k->from[k->n + i] = (struct origin){f.sec, f.start + i};
  k->n += f.len;
  *base = f.base;
  return 0;
}

static int map_index_by_name(const struct load *l, const char *name) {
  for (size_t i = 0; i < l->o->n_maps; i++)
    if (!l->map_secs[i] && !strcmp(l->o->maps[i].name, name)) return (int)i;
  return -1;
}

static int map_index_by_section(const struct load *l, const char *sec) {
  for (size_t i = 0; i < l->o->n_maps; i++)
    if (l->map_secs[i] && !strcmp(l->map_secs[i], sec)) return (int)i;
  return -1;
}

/* Rewrites the lddw at out[i] (relocated by r) into a map reference. */
static int reloc_lddw(struct load *l, struct link *k, size_t i, const struct reloc *r) {
  struct ms_bpf_insn *in = &k->out[i];
  const GElf_Sym *s = &l->syms[r->sym];
  const char *where = sec_name(l, k->from[i].sec);
  uint32_t at = k->from[i].idx;
  if (s->st_shndx == SHN_UNDEF)
    return refuse(l, "%s insn %u: extern '%s' is not supported", where, at, sym_name(l, r->sym));
  if (s->st_shndx >= l->o->n_secs) return refuse(l, "%s insn %u: symbol '%s' is in no section", where, at, sym_name(l, r->sym));
  if (i + 1 >= k->n || k->from[i + 1].sec != k->from[i].sec)
    return refuse(l, "%s insn %u: lddw cut off at the end of its function", where, at);
  if (s->st_shndx == l->maps_sec && l->maps_sec) {
    int m = map_index_by_name(l, sym_name(l, r->sym));
    if (m < 0) return refuse(l, "%s insn %u: '%s' in .maps is not a map libbpf knows", where, at, sym_name(l, r->sym));
    in->src_reg = MS_BPF_PSEUDO_MAP_FD;
    in->imm = m;
    return 0;
  }
  const struct section *ds = &l->o->secs[s->st_shndx];
  int m = map_index_by_section(l, ds->name);
  if (m < 0)
    return refuse(l, "%s insn %u: reference to '%s' in section %s, which is neither a map nor global data",
                  where, at, sym_name(l, r->sym), ds->name);
  uint64_t off = (uint64_t)(uint32_t)in->imm + s->st_value;
  if (off >= l->o->maps[m].value_size)
    return refuse(l, "%s insn %u: offset %llu into %s is beyond its %u bytes", where, at,
                  (unsigned long long)off, ds->name, l->o->maps[m].value_size);
  in[0].src_reg = MS_BPF_PSEUDO_MAP_VALUE;
  in[0].imm = m;
  in[1].imm = (int32_t)off;
  return 0;
}

/* Points the local call at out[i] to its callee, appending the callee. */
static int link_call(struct load *l, struct link *k, size_t i, const struct reloc *r) {
  const struct origin from = k->from[i];
  const char *where = sec_name(l, from.sec);
  uint32_t tsec = from.sec;
  int64_t tidx = (int64_t)from.idx + 1 + k->out[i].imm;
  if (r) {
    const GElf_Sym *s = &l->syms[r->sym];
    if (s->st_shndx >= l->o->n_secs || !is_exec(&l->o->secs[s->st_shndx]))
      return refuse(l, "%s insn %u: call to '%s', which is not code", where, from.idx, sym_name(l, r->sym));
    tsec = s->st_shndx;
    tidx = (int64_t)(s->st_value / 8) + 1 + k->out[i].imm;
  }
  struct func f;
  if (tidx < 0 || tidx >= (int64_t)(l->o->secs[tsec].size / 8) || find_func(l, tsec, (uint32_t)tidx, &f))
    return refuse(l, "%s insn %u: call target %lld in %s is not inside a function", where, from.idx,
                  (long long)tidx, sec_name(l, tsec));
  size_t base;
  int err = append_func(l, k, f, &base);
  if (err) return err;
  k->out[i].imm = (int32_t)((int64_t)(base + (size_t)(tidx - f.start)) - (int64_t)i - 1);
  return 0;
}

static int link_prog(struct load *l, struct link *k) {
  for (size_t i = 0; i < k->n; i++) { /* k->n grows as callees are appended */
    struct ms_bpf_insn *in = &k->out[i];
    const struct reloc *r = find_reloc(l, k->from[i].sec, k->from[i].idx);
    int lddw = in->code == (MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW);
    int call = in->code == (MS_BPF_JMP | MS_BPF_CALL) && in->src_reg == MS_BPF_PSEUDO_CALL;
    int err = 0;
    if (lddw && r) err = reloc_lddw(l, k, i, r);
    else if (call) err = link_call(l, k, i, r);
    else if (r)
      err = refuse(l, "%s insn %u: relocation against '%s' on an instruction that is neither lddw nor call",
                   sec_name(l, k->from[i].sec), k->from[i].idx, sym_name(l, r->sym));
    if (err) return err;
    if (lddw) i++;
  }
  return 0;
}

static size_t section_index(const struct load *l, const char *name) {
  for (size_t i = 1; i < l->o->n_secs; i++)
    if (is_exec(&l->o->secs[i]) && !strcmp(l->o->secs[i].name, name)) return i;
  return 0;
}

/* The entry program's function: a function symbol named like it in its section. */
static int entry_func(struct load *l, const char *name, size_t sec, size_t insn_cnt, struct func *f) {
  for (size_t i = 0; i < l->n_syms; i++) {
    const GElf_Sym *s = &l->syms[i];
    if (GELF_ST_TYPE(s->st_info) != STT_FUNC || s->st_shndx != sec || strcmp(sym_name(l, (uint32_t)i), name))
      continue;
    if (s->st_size / 8 != insn_cnt)
      return refuse(l, "program %s (section %s): %zu instructions per libbpf, %llu per its symbol", name,
                    sec_name(l, sec), insn_cnt, (unsigned long long)(s->st_size / 8));
    *f = (struct func){(uint32_t)sec, (uint32_t)(s->st_value / 8), (uint32_t)(s->st_size / 8), 0};
    return 0;
  }
  return refuse(l, "program %s: no function symbol in section %s", name, sec_name(l, sec));
}

static int take_prog(struct load *l, const struct bpf_program *p) {
  const char *name = bpf_program__name(p), *secname = bpf_program__section_name(p);
  size_t sec = section_index(l, secname);
  struct func f;
  if (!sec) return refuse(l, "program %s: section %s not found", name, secname);
  int err = entry_func(l, name, sec, bpf_program__insn_cnt(p), &f);
  if (err) return err;
  struct link k = {.prog = name};
  size_t base;
  err = append_func(l, &k, f, &base);
  if (!err) err = link_prog(l, &k);
  if (!err) {
    char logbuf[256] = "";
    struct ms_textbuf plog = {logbuf, sizeof logbuf, 0, 0};
    struct ms_bpf_prog_opts po = {.sz = sizeof po, .name = name, .section = secname,
                                  .maps = l->o->maps, .n_maps = l->o->n_maps, .log = &plog};
    struct ms_bpf_prog *prog = ms_bpf_prog_new(k.out, k.n, &po);
    if (!prog) err = errno == ENOMEM ? -ENOMEM : refuse(l, "program %s (section %s): %s", name, secname, logbuf);
    else l->o->progs[l->o->n_progs++] = prog;
  }
  free(k.out);
  free(k.from);
  free(k.funcs);
  return err;
}

static int take_progs(struct load *l, struct bpf_object *bo) {
  struct bpf_program *p;
  size_t n = 0;
  bpf_object__for_each_program(p, bo) n++;
  l->o->progs = calloc(n + 1, sizeof *l->o->progs);
  if (!l->o->progs) return -ENOMEM;
  int err = 0;
  bpf_object__for_each_program(p, bo) {
    if ((err = take_prog(l, p))) break;
  }
  return err;
}

static int take_license(struct load *l) {
  const void *data;
  size_t size;
  data = ms_bpf_object_section(l->o, "license", &size);
  size_t n = data ? strnlen(data, size) : 0;
  l->o->license = malloc(n + 1);
  if (!l->o->license) return -ENOMEM;
  if (n) memcpy(l->o->license, data, n);
  l->o->license[n] = 0;
  return 0;
}

/* ---- the object --------------------------------------------------------- */

void ms_bpf_object_free(struct ms_bpf_object *o) {
  if (!o) return;
  for (size_t i = 0; i < o->n_progs; i++) ms_bpf_prog_free(o->progs[i]);
  for (size_t i = 0; o->map_init && i < o->n_maps; i++) free(o->map_init[i]);
  for (size_t i = 0; o->secs && i < o->n_secs; i++) free(o->secs[i].name);
  free(o->progs);
  free(o->map_init);
  free(o->map_init_size);
  free(o->maps);
  free(o->secs);
  free(o->image);
  free(o->license);
  free(o);
}

static void load_done(struct load *l) {
  for (size_t i = 0; l->relocs && i < l->o->n_secs; i++) free(l->relocs[i].r);
  free(l->relocs);
  free(l->syms);
  free(l->map_secs);
  if (l->elf) elf_end(l->elf);
}

static int open_libbpf(struct load *l, const char *name) {
  /* libbpf reads its own copy: it must not see the buffer change, nor keep it */
  void *copy = malloc(l->o->image_size);
  if (!copy) return -ENOMEM;
  memcpy(copy, l->o->image, l->o->image_size);
  LIBBPF_OPTS(bpf_object_open_opts, opts, .object_name = name);
  libbpf_log = l->log;
  struct bpf_object *bo = bpf_object__open_mem(copy, l->o->image_size, &opts);
  int err = bo ? 0 : -errno;
  if (!bo) {
    char why[128];
    libbpf_strerror(err, why, sizeof why); /* knows libbpf's own codes too */
    refuse(l, "libbpf cannot open the object: %s", why);
  }
  if (!err) err = take_maps(l, bo);
  if (!err) err = take_progs(l, bo);
  bpf_object__close(bo);
  libbpf_log = NULL;
  free(copy);
  return err == -ENOMEM ? err : err ? -MS_E_FORMAT : 0;
}

/* ---- program bundles ---------------------------------------------------- */

/* A bundle is what a compiler that is not clang hands the loader: map
 * definitions and programs, nothing to relocate. Little-endian throughout:
 *   "MSBPFBN1", u32 format (1), u32 abi_version, u32 n_maps, u32 n_progs,
 *   n_maps x { char name[64], u32 type, key_size, value_size, max_entries, flags },
 *   n_progs x { char name[64], char section[64], u32 n_insns, n_insns x 8 bytes }.
 * Names are NUL-padded. Every count is checked against the bytes left before
 * anything is allocated for it; the instructions get the same syntactic check
 * as an ELF's (ms_bpf_prog_new) and, as always, the verifier proves the rest. */
#define BUNDLE_HEAD_V1 24  /* format 1: no schema digest */
#define BUNDLE_HEAD 40     /* format 2: + the schema digests (2 x u64) at 24 */
#define BUNDLE_MAP 84
#define BUNDLE_PROG_HEAD 132

static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void wr32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A NUL-padded name of 64 bytes: printable ASCII, terminated inside the field. */
static int bundle_name(struct load *l, const uint8_t *p, char *out, const char *what, size_t at) {
  size_t n = strnlen((const char *)p, 64);
  if (n == 64 || n == 0) return refuse(l, "bundle: %s at byte %zu: name empty or not terminated within 64 bytes", what, at);
  for (size_t i = 0; i < n; i++)
    if (p[i] < 0x20 || p[i] > 0x7e) return refuse(l, "bundle: %s at byte %zu: name has byte 0x%02x", what, at, p[i]);
  memcpy(out, p, n + 1);
  return 0;
}

static int bundle_maps(struct load *l, const uint8_t *p, size_t size, size_t *at, uint32_t n_maps) {
  if (n_maps > MS_BPF_MAX_MAPS) return refuse(l, "bundle: %u maps, at most %d", n_maps, MS_BPF_MAX_MAPS);
  if ((size - *at) / BUNDLE_MAP < n_maps) return refuse(l, "bundle: %u maps do not fit in %zu bytes", n_maps, size);
  struct ms_bpf_object *o = l->o;
  o->maps = calloc(n_maps ? n_maps : 1, sizeof *o->maps);
  o->map_init = calloc(n_maps ? n_maps : 1, sizeof *o->map_init);
  o->map_init_size = calloc(n_maps ? n_maps : 1, sizeof *o->map_init_size);
  if (!o->maps || !o->map_init || !o->map_init_size) return -ENOMEM;
  for (uint32_t i = 0; i < n_maps; i++, *at += BUNDLE_MAP) {
    struct ms_bpf_map_def *d = &o->maps[i];
    const uint8_t *m = p + *at;
    int err = bundle_name(l, m, d->name, "map", *at);
    if (err) return err;
    d->type = rd32(m + 64);
    d->key_size = rd32(m + 68);
    d->value_size = rd32(m + 72);
    d->max_entries = rd32(m + 76);
    d->flags = rd32(m + 80);
    o->n_maps = i + 1;
  }
  return 0;
}

static int bundle_progs(struct load *l, const uint8_t *p, size_t size, size_t *at, uint32_t n_progs) {
  struct ms_bpf_object *o = l->o;
  if (n_progs == 0 || (size - *at) / BUNDLE_PROG_HEAD < n_progs)
    return refuse(l, "bundle: %u programs do not fit in %zu bytes", n_progs, size);
  o->progs = calloc(n_progs, sizeof *o->progs);
  if (!o->progs) return -ENOMEM;
  for (uint32_t i = 0; i < n_progs; i++) {
    char name[64], section[64];
    size_t start = *at;
    if (size - *at < BUNDLE_PROG_HEAD) return refuse(l, "bundle: program %u at byte %zu: truncated", i, start);
    int err = bundle_name(l, p + *at, name, "program", start);
    if (!err) err = bundle_name(l, p + *at + 64, section, "program section", start + 64);
    if (err) return err;
    uint32_t n = rd32(p + *at + 128);
    *at += BUNDLE_PROG_HEAD;
    if (n == 0 || n > MS_BPF_MAX_INSNS || (size - *at) / sizeof(struct ms_bpf_insn) < n)
      return refuse(l, "bundle: program '%s' at byte %zu: %u instructions do not fit", name, start, n);
    struct ms_bpf_insn *insns = malloc(n * sizeof *insns);
    if (!insns) return -ENOMEM;
    memcpy(insns, p + *at, n * sizeof *insns); /* the host is little-endian, as the format */
    *at += n * sizeof *insns;
    char plog_buf[512] = "";
    struct ms_textbuf plog = {.buf = plog_buf, .size = sizeof plog_buf};
    struct ms_bpf_prog_opts po = {.sz = sizeof po, .name = name, .section = section,
                                  .maps = o->maps, .n_maps = o->n_maps, .log = &plog};
    o->progs[i] = ms_bpf_prog_new(insns, n, &po);
    free(insns);
    if (!o->progs[i]) return errno == ENOMEM ? -ENOMEM : refuse(l, "bundle: program '%s': %s", name, plog_buf);
    o->n_progs = i + 1;
  }
  return 0;
}

/* The ABI version becomes a "megascope_abi" section, as clang's objects
 * carry it; the schema digests (format 2, where set) a "megascope_schema" one. */
static int bundle_sections(struct load *l, size_t abi_off, size_t schema_off) {
  struct ms_bpf_object *o = l->o;
  o->secs = calloc(3, sizeof *o->secs);
  if (!o->secs || !(o->secs[1].name = strdup("megascope_abi"))) return -ENOMEM;
  o->secs[1].data = o->image + abi_off;
  o->secs[1].size = 4;
  o->n_secs = 2;
  int set = 0;
  for (int i = 0; schema_off && i < 4; i++) set |= rd32(o->image + schema_off + 4 * (size_t)i) != 0;
  if (set) {
    if (!(o->secs[2].name = strdup("megascope_schema"))) return -ENOMEM;
    o->secs[2].data = o->image + schema_off;
    o->secs[2].size = 16;
    o->n_secs = 3;
  }
  o->license = strdup("");
  return o->license ? 0 : -ENOMEM;
}

static int open_bundle(struct load *l) {
  const uint8_t *p = l->o->image;
  size_t size = l->o->image_size;
  if (size < BUNDLE_HEAD_V1) return refuse(l, "bundle: %zu bytes, shorter than its header", size);
  uint32_t format = rd32(p + 8);
  if (format != 1 && format != MS_BPF_BUNDLE_FORMAT)
    return refuse(l, "bundle: format %u; this loader reads formats 1 and %d", format, MS_BPF_BUNDLE_FORMAT);
  size_t at = format == 1 ? BUNDLE_HEAD_V1 : BUNDLE_HEAD;
  if (size < at) return refuse(l, "bundle: %zu bytes, shorter than its header", size);
  int err = bundle_maps(l, p, size, &at, rd32(p + 16));
  if (!err) err = bundle_progs(l, p, size, &at, rd32(p + 20));
  if (!err && at != size) err = refuse(l, "bundle: %zu bytes after the last program", size - at);
  if (!err) err = bundle_sections(l, 12, format == 1 ? 0 : 24);
  return err;
}

int ms_bpf_bundle_write(const struct ms_bpf_map_def *maps, size_t n_maps, const struct ms_bpf_bundle_prog *progs,
                        size_t n_progs, uint32_t abi_version, const uint64_t *schema, void **out, size_t *len) {
  size_t size = BUNDLE_HEAD + n_maps * BUNDLE_MAP;
  for (size_t i = 0; i < n_progs; i++) size += BUNDLE_PROG_HEAD + progs[i].n * sizeof(struct ms_bpf_insn);
  uint8_t *b = calloc(1, size);
  if (!b) return -ENOMEM;
  memcpy(b, MS_BPF_BUNDLE_MAGIC, 8);
  wr32(b + 8, MS_BPF_BUNDLE_FORMAT);
  wr32(b + 12, abi_version);
  wr32(b + 16, (uint32_t)n_maps);
  wr32(b + 20, (uint32_t)n_progs);
  for (int i = 0; schema && i < 2; i++) {  /* the digests, little-endian */
    wr32(b + 24 + 8 * i, (uint32_t)schema[i]);
    wr32(b + 28 + 8 * i, (uint32_t)(schema[i] >> 32));
  }
  uint8_t *q = b + BUNDLE_HEAD;
  for (size_t i = 0; i < n_maps; i++, q += BUNDLE_MAP) {
    snprintf((char *)q, 64, "%s", maps[i].name);
    wr32(q + 64, maps[i].type);
    wr32(q + 68, maps[i].key_size);
    wr32(q + 72, maps[i].value_size);
    wr32(q + 76, maps[i].max_entries);
    wr32(q + 80, maps[i].flags);
  }
  for (size_t i = 0; i < n_progs; i++) {
    snprintf((char *)q, 64, "%s", progs[i].name);
    snprintf((char *)q + 64, 64, "%s", progs[i].section);
    wr32(q + 128, (uint32_t)progs[i].n);
    q += BUNDLE_PROG_HEAD;
    memcpy(q, progs[i].insns, progs[i].n * sizeof(struct ms_bpf_insn));
    q += progs[i].n * sizeof(struct ms_bpf_insn);
  }
  *out = b;
  *len = size;
  return 0;
}

struct ms_bpf_object *ms_bpf_object_open_mem(const void *buf, size_t size, const char *name,
                                             struct ms_textbuf *log) {
  pthread_once(&libbpf_once, libbpf_setup);
  struct load l = {.log = log};
  int err = -ENOMEM;
  l.o = calloc(1, sizeof *l.o);
  if (!l.o || !buf) goto out;
  l.o->image = malloc(size ? size : 1);
  if (!l.o->image) goto out;
  memcpy(l.o->image, buf, size);
  l.o->image_size = size;
  if (size >= 8 && !memcmp(buf, MS_BPF_BUNDLE_MAGIC, 8)) {
    err = open_bundle(&l);
    goto out;
  }
  l.elf = elf_memory((char *)l.o->image, size);
  err = l.elf ? check_elf(&l) : refuse(&l, "not an ELF file: %s", elf_errmsg(-1));
  if (!err) err = open_libbpf(&l, name ? name : "obj");
  if (!err) err = take_license(&l);
out:
  load_done(&l);
  if (err) {
    ms_bpf_object_free(l.o);
    errno = err == -ENOMEM ? ENOMEM : (err < 0 ? -err : EINVAL);
    return NULL;
  }
  return l.o;
}

struct ms_bpf_object *ms_bpf_object_open_file(const char *path, struct ms_textbuf *log) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) < 0) {
    int e = errno;
    ms_textbuf_printf(log, "%s: %s\n", path, strerror(e));
    if (fd >= 0) close(fd);
    errno = e;
    return NULL;
  }
  size_t size = (size_t)st.st_size;
  uint8_t *buf = malloc(size ? size : 1);
  size_t got = 0;
  while (buf && got < size) {
    ssize_t k = read(fd, buf + got, size - got);
    if (k <= 0) break;
    got += (size_t)k;
  }
  close(fd);
  if (!buf || got != size) {
    ms_textbuf_printf(log, "%s: cannot read %zu bytes\n", path, size);
    free(buf);
    errno = buf ? EIO : ENOMEM;
    return NULL;
  }
  const char *base = strrchr(path, '/');
  char name[64];
  snprintf(name, sizeof name, "%s", base ? base + 1 : path);
  char *dot = strchr(name, '.');
  if (dot && dot != name) *dot = 0;
  struct ms_bpf_object *o = ms_bpf_object_open_mem(buf, size, name, log);
  free(buf);
  return o;
}

const char *ms_bpf_object_license(const struct ms_bpf_object *o) { return o->license; }
size_t ms_bpf_object_map_count(const struct ms_bpf_object *o) { return o->n_maps; }

const struct ms_bpf_map_def *ms_bpf_object_map(const struct ms_bpf_object *o, size_t idx) {
  return idx < o->n_maps ? &o->maps[idx] : NULL;
}

const void *ms_bpf_object_map_init(const struct ms_bpf_object *o, size_t idx, size_t *size) {
  if (idx >= o->n_maps || !o->map_init[idx]) return NULL;
  if (size) *size = o->map_init_size[idx];
  return o->map_init[idx];
}

size_t ms_bpf_object_prog_count(const struct ms_bpf_object *o) { return o->n_progs; }

const struct ms_bpf_prog *ms_bpf_object_prog(const struct ms_bpf_object *o, size_t idx) {
  return idx < o->n_progs ? o->progs[idx] : NULL;
}

const struct ms_bpf_prog *ms_bpf_object_find_prog(const struct ms_bpf_object *o, const char *section) {
  for (size_t i = 0; i < o->n_progs; i++)
    if (!strcmp(ms_bpf_prog_section(o->progs[i]), section)) return o->progs[i];
  return NULL;
}

const void *ms_bpf_object_section(const struct ms_bpf_object *o, const char *name, size_t *size) {
  for (size_t i = 1; i < o->n_secs; i++) {
    const struct section *s = &o->secs[i];
    if (s->name && s->data && !strcmp(s->name, name)) {
      if (size) *size = s->size;
      return s->data;
    }
  }
  return NULL;
}
