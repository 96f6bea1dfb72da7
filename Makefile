# kvfs - hand-written Makefile.
#
#   make            build everything into build/ (programs in build/bin/)
#   make test       install missing packages, build with -Werror, run all tests
#   make asan       the same tests on an ASan/UBSan build (build-asan/)
#   make tsan       the unit tests on a ThreadSanitizer build (build-tsan/)
#   make test-gpu   the device tests against the cuda backend (NVIDIA GPU)
#   make test-gpu-emu  the same against a cudart stand-in (no GPU needed;
#                   part of make test whenever the CUDA toolkit is present)
#   make demo       build, make a store, mount, run a workload, unmount
#   make bench      benchmarks (figures, no assertions)
#   make deps       install missing Debian packages (needs root)
#   make install    programs, libkvfs, kvfs.py, man pages, systemd units
#                   into $(DESTDIR)$(PREFIX) (PREFIX=/usr/local)
#   make V=1        show the commands
#
# CFLAGS/LDFLAGS are yours to set; the flags kvfs needs are added with
# override so they cannot be lost.

BUILD ?= build
CC ?= cc
NVCC ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CFLAGS ?= -O2 -g
LDFLAGS ?=
WERROR ?= 0

# Debian packages the build, the tests and the demo need.
DEB_PKGS := build-essential pkg-config libfuse3-dev fuse3 liblmdb-dev \
	liburing-dev libcmocka-dev libinih-dev libssl-dev libisal-dev \
	libxxhash-dev libopenblas-dev attr fio gnuplot-nox psmisc \
	python3 libhiredis-dev redis-server redis-tools rsync \
	python3-torch libsystemd-dev man-db groff-base \
	libmicrohttpd-dev curl prometheus

override CFLAGS += -std=gnu11 -pthread -I. -MMD -MP \
	-D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 \
	-Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
	-Wno-unused-parameter -Wformat=2 -Wvla \
	$(shell pkg-config --cflags fuse3 2>/dev/null)
ifeq ($(WERROR),1)
override CFLAGS += -Werror
endif
ifeq ($(SANITIZE),1)
override CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer \
	-fno-sanitize-recover=undefined
override LDFLAGS += -fsanitize=address,undefined
endif
ifeq ($(SANITIZE),thread)
override CFLAGS += -fsanitize=thread -fno-omit-frame-pointer
override LDFLAGS += -fsanitize=thread
endif

LIBS := -lfuse3 -llmdb -luring -linih -lcrypto -lisal -lxxhash \
	-lopenblas -lhiredis -lmicrohttpd -lm -lpthread
# The daemon tells systemd it is ready (Type=notify) where libsystemd is.
KVFS_SYSTEMD ?= $(shell pkg-config --exists libsystemd 2>/dev/null && echo 1)
ifeq ($(KVFS_SYSTEMD),1)
$(BUILD)/obj/fs/kvfs_main.o: override CFLAGS += -DKVFS_HAVE_SYSTEMD
$(BUILD)/bin/kvfs: LIBS += -lsystemd
endif
TEST_LIBS := -lcmocka

# CUDA: the device tier's cuda backend (gpu/tier_cuda.c) is built whenever
# the toolkit is present; `make KVFS_CUDA=0` leaves it out. cudart is linked
# statically so every program still starts, and reports no device, on a
# machine without the NVIDIA driver. -isystem keeps the toolkit's headers
# out of -Werror.
CUDA_HOME ?= /usr/local/cuda
KVFS_CUDA ?= $(if $(wildcard $(CUDA_HOME)/include/cuda_runtime.h),1,0)
ifeq ($(KVFS_CUDA),1)
override CFLAGS += -DKVFS_HAVE_CUDA -isystem $(CUDA_HOME)/include
ifeq ($(CUDAEMU),1)
# tests/gpu/cudaemu.c stands in for cudart (host memory, deferred stream
# work): the cuda backend's logic runs without a GPU. The restoration
# kernels are C re-implementations of their documented math
# (tests/gpu/cudaemu_kern.c), so gpu/restore_cuda.c builds its real path;
# cuBLAS is a fake on OpenBLAS (tests/gpu/cublasemu.c, loaded through
# KVFS_CUBLAS_LIB) that finds kvfs_cudaemu_* in the executable, hence
# -rdynamic. restore_kern.cu itself is not run.
NVCC :=
EMU_OBJS := $(BUILD)/obj/tests/gpu/cudaemu.o \
	$(BUILD)/obj/tests/gpu/cudaemu_kern.o
EMU_CUBLAS := $(BUILD)/lib/libcublas-emu.so
override CFLAGS += -DKVFS_HAVE_CUDA_KERNELS
override LDFLAGS += -rdynamic
else
LIBS += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt
endif
endif
# Kernels (gpu/*.cu, the GPU restoration path) need nvcc as well; without
# it gpu/restore_cuda.c builds its -EOPNOTSUPP stubs. Device code for
# sm_80 (A100) and sm_90 (H100/H200), plus sm_90 PTX that newer GPUs JIT.
# No C++ runtime is needed: no exceptions, RTTI or guarded statics, so
# the C link line stays as it is. cuBLAS is dlopen'ed at run time.
CU_SRCS :=
ifeq ($(KVFS_CUDA),1)
ifneq ($(NVCC),)
CU_SRCS := $(wildcard gpu/*.cu)
override CFLAGS += -DKVFS_HAVE_CUDA_KERNELS
endif
endif
NVCCFLAGS ?= -O2
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 \
	-gencode arch=compute_90,code=[sm_90,compute_90]
override NVCCFLAGS += -std=c++17 -I. -MMD -MP -DKVFS_HAVE_CUDA $(CUDA_ARCH) \
	-Xcompiler -Wall,-Wextra,-fno-exceptions,-fno-rtti,-fno-threadsafe-statics
ifeq ($(WERROR),1)
override NVCCFLAGS += -Werror all-warnings -Xcompiler -Werror
endif
# Unit tests and integration scripts that honour KVFS_TEST_GPU.
GPU_UNIT := $(patsubst tests/unit/%.c,%,$(shell grep -l KVFS_TEST_GPU tests/unit/test_*.c 2>/dev/null))
GPU_ITEST := $(shell grep -l KVFS_TEST_GPU tests/integration/test_*.sh 2>/dev/null)

ifeq ($(V),1)
Q :=
msg = @true
else
Q := @
msg = @printf '  %-6s %s\n' $(1) $(2)
endif

# Every .c in a module folder is library code, except program entry points
# (*_main.c).
LIB_SRCS := $(filter-out %_main.c,$(wildcard meta/*.c tier/*.c hcache/*.c gpu/*.c cache/*.c sim/*.c fs/*.c))
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o) $(CU_SRCS:%.cu=$(BUILD)/obj/%.o) \
	$(EMU_OBJS)
LIB := $(BUILD)/libkvfscore.a

# program name = main source
PROGS := kvfs kvfsctl mkfs.kvfs kvfs-gen kvfs-sim
kvfs_MAIN := fs/kvfs_main.c
kvfsctl_MAIN := client/kvfsctl_main.c
mkfs.kvfs_MAIN := mkfs/mkfs_main.c
kvfs-gen_MAIN := client/gen_main.c
kvfs-sim_MAIN := sim/sim_main.c
# The example engine exists once its source does.
PROGS += $(if $(wildcard client/engine_main.c),kvfs-engine)
kvfs-engine_MAIN := client/engine_main.c
PROG_BINS := $(PROGS:%=$(BUILD)/bin/%)
# The reference engine (client/kvfs_engine/, Python and torch): a launcher
# that runs /usr/bin/python3 on the package in this source tree.
PY_ENGINE := $(if $(wildcard client/kvfs_engine/engine.py),$(BUILD)/bin/kvfs-torch-engine)

# libkvfs: the client library engines link (shared and static), with the
# block-format code it needs for key chains.
LIBKVFS_SRCS := $(if $(wildcard client/libkvfs.c),client/libkvfs.c client/libkvfs_shm.c meta/fmt.c meta/util.c meta/log.c)
LIBKVFS_A := $(if $(LIBKVFS_SRCS),$(BUILD)/lib/libkvfs.a)
LIBKVFS := $(if $(LIBKVFS_SRCS),$(LIBKVFS_A) $(BUILD)/lib/libkvfs.so)

UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
# Programs the mount-level tests drive (cmocka, run by the scripts). The
# fuzzer's other files (fuzz_*.c) are pieces of fuzz_client, not programs.
FUZZ_SRCS := $(filter-out tests/integration/fuzz_client.c,$(wildcard tests/integration/fuzz_*.c))
ITEST_SRCS := $(filter-out $(FUZZ_SRCS),$(wildcard tests/integration/*.c))
ITEST_BINS := $(ITEST_SRCS:tests/integration/%.c=$(BUILD)/itests/%)
BENCH_SRCS := $(wildcard tests/bench/bench_*.c)
BENCH_BINS := $(BENCH_SRCS:tests/bench/%.c=$(BUILD)/bench/%)

.PHONY: all deps test unit integration asan demo bench clean format check-format
all: $(PROG_BINS) $(UNIT_BINS) $(ITEST_BINS) $(BENCH_BINS) $(LIBKVFS) $(PY_ENGINE)

$(BUILD)/bin/kvfs-torch-engine: Makefile
	$(call msg,GEN,$@)
	@mkdir -p $(@D)
	$(Q)printf '%s\n' '#!/bin/sh' \
		'# kvfs-torch-engine: the reference engine (client/kvfs_engine).' \
		'export KVFS_LIB="$${KVFS_LIB:-$(abspath $(BUILD))/lib/libkvfs.so}"' \
		'export PYTHONPATH="$(CURDIR)/client$${PYTHONPATH:+:$$PYTHONPATH}"' \
		'exec /usr/bin/python3 -m kvfs_engine.engine "$$@"' >$@.tmp && \
		chmod 755 $@.tmp && mv $@.tmp $@

$(BUILD)/obj/%.o: %.c
	$(call msg,CC,$<)
	@mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/obj/%.o: %.cu
	$(call msg,NVCC,$<)
	@mkdir -p $(@D)
	$(Q)$(NVCC) $(NVCCFLAGS) -c -o $@ $<

$(BUILD)/pic/%.o: %.c
	$(call msg,CC,$<)
	@mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) -fPIC -c -o $@ $<

$(BUILD)/lib/libkvfs.a: $(LIBKVFS_SRCS:%.c=$(BUILD)/obj/%.o)
	$(call msg,AR,$@)
	@mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/lib/libkvfs.so: $(LIBKVFS_SRCS:%.c=$(BUILD)/pic/%.o)
	$(call msg,LD,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,-soname,libkvfs.so.1 -o $@ $^ -lcrypto -lisal -lpthread

$(LIB): $(LIB_OBJS)
	$(call msg,AR,$@)
	@mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

# Clients of libkvfs link it first ($^ keeps prerequisite order).
$(BUILD)/bin/kvfs-engine $(BUILD)/bin/kvfsctl $(BUILD)/tests/test_libkvfs $(BUILD)/bench/bench_ctl \
	$(BUILD)/itests/remote_client $(BUILD)/bench/bench_remote: $(LIBKVFS_A)

# The tiny checkpoints and double-precision reference of the restoration
# tests, shared by the CPU and the GPU suites, the chunk reads of
# hidden-state blocks (unit and integration) and the HCache mount test.
# ckpt_ref.o follows the archive in $^: the archive comes again for what
# only ckpt_ref.o needs from it (the suites' loader and log).
CKPT_REF_USERS := $(BUILD)/tests/test_restore $(BUILD)/tests/test_restore_cuda \
	$(BUILD)/tests/test_chunk_hidden $(BUILD)/itests/chunks_client \
	$(BUILD)/itests/hcache_client
$(CKPT_REF_USERS): $(BUILD)/obj/tests/unit/ckpt_ref.o
$(CKPT_REF_USERS): TEST_LIBS += $(LIB)

# The fixture of the chunk-read suites, linked the same way.
CHUNK_FX_USERS := $(BUILD)/tests/test_chunk $(BUILD)/tests/test_chunk_spec \
	$(BUILD)/tests/test_chunk_hidden
$(CHUNK_FX_USERS): $(BUILD)/obj/tests/unit/chunk_fx.o
$(CHUNK_FX_USERS): TEST_LIBS += $(LIB)

# The seeded buffers of the tier suites, linked the same way.
TIER_FX_USERS := $(BUILD)/tests/test_tier $(BUILD)/tests/test_tier_ssd
$(TIER_FX_USERS): $(BUILD)/obj/tests/unit/tier_fx.o
$(TIER_FX_USERS): TEST_LIBS += $(LIB)

# The device tier suite's harness and its other test files (gpu_tier_i.h),
# linked the same way.
GPU_TIER_SRCS := $(wildcard tests/unit/gpu_tier_*.c)
$(BUILD)/tests/test_gpu_tier: $(GPU_TIER_SRCS:%.c=$(BUILD)/obj/%.o)
$(BUILD)/tests/test_gpu_tier: TEST_LIBS += $(LIB)

# The mount fuzzer's harness and target families, linked the same way.
$(BUILD)/itests/fuzz_client: $(FUZZ_SRCS:%.c=$(BUILD)/obj/%.o)
$(BUILD)/itests/fuzz_client: TEST_LIBS += $(LIB)

# Keep objects of programs and tests: they are not throwaway intermediates.
.SECONDARY:

.SECONDEXPANSION:
$(BUILD)/bin/%: $(BUILD)/obj/$$(basename $$(%_MAIN)).o $(LIB)
	$(call msg,LD,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -pthread -o $@ $^ $(LIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(LIB)
	$(call msg,LD,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -pthread -o $@ $^ $(TEST_LIBS) $(LIBS)

$(BUILD)/itests/%: $(BUILD)/obj/tests/integration/%.o $(LIB)
	$(call msg,LD,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -pthread -o $@ $^ $(TEST_LIBS) $(LIBS)

$(BUILD)/bench/%: $(BUILD)/obj/tests/bench/%.o $(LIB)
	$(call msg,LD,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -pthread -o $@ $^ $(LIBS)

# Install only what is missing; a no-op on a machine that has it all.
deps:
	@missing=$$(for p in $(DEB_PKGS); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; \
	done); \
	if [ -n "$$missing" ]; then \
		echo "  DEPS   installing:" $$missing; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null || \
		{ echo "kvfs: could not install: $$missing" >&2; exit 1; }; \
	fi

test: deps
	$(Q)$(MAKE) --no-print-directory WERROR=1 all
	$(Q)BUILD=$(BUILD) tests/run.sh
ifeq ($(KVFS_CUDA),1)
	$(Q)$(MAKE) --no-print-directory test-gpu-emu
endif

unit: all
	$(Q)BUILD=$(BUILD) tests/run.sh unit

integration: all
	$(Q)BUILD=$(BUILD) tests/run.sh integration

asan: deps
	$(Q)$(MAKE) --no-print-directory BUILD=build-asan SANITIZE=1 WERROR=1 CFLAGS="-O1 -g" all
	$(Q)BUILD=build-asan ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 tests/run.sh

# The unit tests under ThreadSanitizer: the engine's threads, flights and
# caches are driven from several threads there. Without CUDA: cudart is
# not instrumented. test_guard is left out: the guard leaves its SIGBUS
# and SIGSEGV handler by siglongjmp, which TSan's deferred signal delivery
# does not support (the test hangs).
.PHONY: tsan
tsan: deps
	$(Q)$(MAKE) --no-print-directory BUILD=build-tsan SANITIZE=thread \
		KVFS_CUDA=0 WERROR=1 CFLAGS="-O1 -g" all
	$(Q)BUILD=build-tsan KVFS_TEST_SKIP=test_guard \
		TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
		tests/run.sh unit

# The device tests against the cuda backend: run on a host with an NVIDIA
# GPU (a missing device fails them).
.PHONY: test-gpu
test-gpu: deps
	$(Q)$(MAKE) --no-print-directory WERROR=1 all
	$(Q)[ "$(KVFS_CUDA)" = 1 ] || { echo "kvfs: no CUDA toolkit in $(CUDA_HOME)" >&2; exit 1; }
	$(Q)fail=0; \
	for t in $(GPU_UNIT); do \
		echo "  GPU    $$t"; \
		KVFS_TEST_GPU=cuda $(BUILD)/tests/$$t || fail=1; \
	done; \
	for t in $(GPU_ITEST); do \
		echo "  GPU    $$t"; \
		BUILD=$(BUILD) KVFS_TEST_GPU=cuda bash $$t || fail=1; \
	done; \
	exit $$fail

# The same device tests against tests/gpu/cudaemu.c instead of cudart: the
# cuda backend's pools, staging, batching, events and IPC handles, and the
# host side of the GPU restoration (its kernels emulated in C, cuBLAS
# faked on OpenBLAS), run on a machine without a GPU. The unit suites run
# in both of the stand-in's stream orders (lazy: a missing wait for a
# writer shows; eager: a missing wait for a reader shows). Built apart,
# in $(BUILD)-cudaemu; bench_restore_cuda is built there but not run, and
# bench_gpu_fetch runs small, as a check that its FETCH lands right, and
# once with --hidden, so that a FETCH restoring on the GPU runs too.
EMU_BUILD := $(BUILD)-cudaemu
EMU_UNIT := $(GPU_UNIT)
EMU_ENV := KVFS_TEST_GPU=cuda \
	KVFS_CUBLAS_LIB=$(abspath $(EMU_BUILD))/lib/libcublas-emu.so
.PHONY: test-gpu-emu
test-gpu-emu: deps
	$(Q)[ "$(KVFS_CUDA)" = 1 ] || { echo "kvfs: no CUDA toolkit in $(CUDA_HOME)" >&2; exit 1; }
	$(Q)$(MAKE) --no-print-directory BUILD=$(EMU_BUILD) CUDAEMU=1 WERROR=1 \
		$(PROGS:%=$(EMU_BUILD)/bin/%) \
		$(ITEST_SRCS:tests/integration/%.c=$(EMU_BUILD)/itests/%) \
		$(EMU_UNIT:%=$(EMU_BUILD)/tests/%) \
		$(EMU_BUILD)/bench/bench_restore_cuda $(EMU_BUILD)/bench/bench_gpu_fetch \
		$(EMU_BUILD)/lib/libcublas-emu.so
	$(Q)fail=0; \
	for t in $(EMU_UNIT); do for o in lazy eager; do \
		echo "  EMU    $$t ($$o)"; \
		if KVFS_CUDAEMU_ORDER=$$o $(EMU_ENV) $(EMU_BUILD)/tests/$$t >$(EMU_BUILD)/$$t.$$o.log 2>&1; then \
			grep -h '^\[  PASSED' $(EMU_BUILD)/$$t.$$o.log; \
		else cat $(EMU_BUILD)/$$t.$$o.log; fail=1; fi; \
	done; done; \
	echo "  EMU    bench_gpu_fetch (a small FETCH, bytes checked by an IPC client)"; \
	$(EMU_ENV) $(EMU_BUILD)/bench/bench_gpu_fetch --backend cuda --bytes 32M \
		--iters 1 --no-sweep >$(EMU_BUILD)/bench_gpu_fetch.log 2>&1 || \
		{ cat $(EMU_BUILD)/bench_gpu_fetch.log; fail=1; }; \
	echo "  EMU    bench_gpu_fetch --hidden (a small FETCH restored on the GPU)"; \
	$(EMU_ENV) $(EMU_BUILD)/bench/bench_gpu_fetch --backend cuda --hidden \
		--layers 2 --bytes 4M --iters 1 >$(EMU_BUILD)/bench_gpu_fetch_h.log 2>&1 || \
		{ cat $(EMU_BUILD)/bench_gpu_fetch_h.log; fail=1; }; \
	for t in $(GPU_ITEST); do \
		echo "  EMU    $$t"; \
		BUILD=$(EMU_BUILD) $(EMU_ENV) bash $$t || fail=1; \
	done; \
	exit $$fail

# The fake cuBLAS of the emulated build: its kvfs_cudaemu_* and element
# converters are the executable's.
ifeq ($(CUDAEMU),1)
$(EMU_CUBLAS): $(BUILD)/pic/tests/gpu/cublasemu.o
	$(call msg,LD,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -shared -o $@ $^ -lopenblas -lm
endif

demo: deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)BUILD=$(BUILD) tests/demo.sh

bench: deps
	$(Q)$(MAKE) --no-print-directory CFLAGS="-O2 -g" all
	$(Q)BUILD=$(BUILD) tests/bench/run.sh
	$(Q)BUILD=$(BUILD) tests/bench/ssd_prefault.sh
	$(Q)BUILD=$(BUILD) tests/bench/sim_bench.sh

# ---- install ----
# PREFIX for the programs, libkvfs and its header, the Python module and
# the man pages; the mount helper goes where mount(8) looks (/sbin), the
# unit where systemd does. DESTDIR stages it all (packaging, the tests).
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
MANDIR ?= $(PREFIX)/share/man
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
PYTHONDIR ?= $(PREFIX)/lib/python3/dist-packages
MOUNTHELPERDIR ?= /sbin
SYSTEMDUNITDIR ?= /lib/systemd/system
KVFS_VERSION := 0.18
INSTALL_PROGS := kvfs kvfsctl mkfs.kvfs kvfs-gen kvfs-sim $(if $(wildcard client/engine_main.c),kvfs-engine)
MANPAGES := $(wildcard man/*.[0-9])
SUBST = sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@PREFIX@|$(PREFIX)|g' \
	-e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' \
	-e 's|@VERSION@|$(KVFS_VERSION)|g'

.PHONY: install
install: $(PROG_BINS) $(LIBKVFS)
	$(call msg,INSTALL,$(DESTDIR)$(PREFIX))
	$(Q)install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) \
		$(DESTDIR)$(INCLUDEDIR)/kvfs/meta $(DESTDIR)$(PKGCONFIGDIR) \
		$(DESTDIR)$(PYTHONDIR) $(DESTDIR)$(MANDIR)/man3 \
		$(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8 \
		$(DESTDIR)$(MOUNTHELPERDIR) $(DESTDIR)$(SYSTEMDUNITDIR)
	$(Q)install -m 0755 $(INSTALL_PROGS:%=$(BUILD)/bin/%) $(DESTDIR)$(BINDIR)/
	$(Q)install -m 0644 $(BUILD)/lib/libkvfs.a $(DESTDIR)$(LIBDIR)/
	$(Q)install -m 0755 $(BUILD)/lib/libkvfs.so $(DESTDIR)$(LIBDIR)/libkvfs.so.1
	$(Q)ln -sf libkvfs.so.1 $(DESTDIR)$(LIBDIR)/libkvfs.so
	$(Q)install -m 0644 client/libkvfs.h $(DESTDIR)$(INCLUDEDIR)/kvfs/
	$(Q)install -m 0644 meta/kvfs_ctl.h meta/fmt.h $(DESTDIR)$(INCLUDEDIR)/kvfs/meta/
	$(Q)$(SUBST) dist/kvfs.pc.in >$(DESTDIR)$(PKGCONFIGDIR)/kvfs.pc
	$(Q)install -m 0644 client/kvfs.py $(DESTDIR)$(PYTHONDIR)/
	$(Q)for m in $(MANPAGES); do \
		install -m 0644 $$m $(DESTDIR)$(MANDIR)/man$${m##*.}/; done
	$(Q)$(SUBST) dist/mount.kvfs.in >$(DESTDIR)$(MOUNTHELPERDIR)/mount.kvfs
	$(Q)chmod 0755 $(DESTDIR)$(MOUNTHELPERDIR)/mount.kvfs
	$(Q)ln -sf mount.kvfs $(DESTDIR)$(MOUNTHELPERDIR)/mount.fuse.kvfs
	$(Q)$(SUBST) dist/kvfs@.service.in >$(DESTDIR)$(SYSTEMDUNITDIR)/kvfs@.service

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-tsan build-cudaemu

-include $(shell find $(BUILD) build-asan build-tsan -name '*.d' 2>/dev/null)
