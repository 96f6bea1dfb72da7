# kvfs - hand-written Makefile.
#
#   make            build everything into build/ (programs in build/bin/)
#   make test       install missing packages, build with -Werror, run all tests
#   make asan       the same tests on an ASan/UBSan build (build-asan/)
#   make demo       build, make a store, mount, run a workload, unmount
#   make bench      benchmarks (figures, no assertions)
#   make deps       install missing Debian packages (needs root)
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
	libxxhash-dev libopenblas-dev attr fio gnuplot-nox psmisc

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

LIBS := -lfuse3 -llmdb -luring -linih -lcrypto -lisal -lxxhash \
	-lopenblas -lm -lpthread
TEST_LIBS := -lcmocka

ifeq ($(V),1)
Q :=
msg = @true
else
Q := @
msg = @printf '  %-6s %s\n' $(1) $(2)
endif

# Every .c in a module folder is library code, except program entry points
# (*_main.c).
LIB_SRCS := $(filter-out %_main.c,$(wildcard meta/*.c cache/*.c gpu/*.c fs/*.c))
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o)
LIB := $(BUILD)/libkvfscore.a

# program name = main source
PROGS := kvfs kvfsctl mkfs.kvfs kvfs-gen kvfs-sim
kvfs_MAIN := fs/kvfs_main.c
kvfsctl_MAIN := fs/kvfsctl_main.c
mkfs.kvfs_MAIN := mkfs/mkfs_main.c
kvfs-gen_MAIN := fs/gen_main.c
kvfs-sim_MAIN := cache/sim_main.c
PROG_BINS := $(PROGS:%=$(BUILD)/bin/%)

UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
BENCH_SRCS := $(wildcard tests/bench/bench_*.c)
BENCH_BINS := $(BENCH_SRCS:tests/bench/%.c=$(BUILD)/bench/%)

.PHONY: all deps test unit integration asan demo bench clean format check-format
all: $(PROG_BINS) $(UNIT_BINS) $(BENCH_BINS)

$(BUILD)/obj/%.o: %.c
	$(call msg,CC,$<)
	@mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

$(LIB): $(LIB_OBJS)
	$(call msg,AR,$@)
	@mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

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

unit: all
	$(Q)BUILD=$(BUILD) tests/run.sh unit

integration: all
	$(Q)BUILD=$(BUILD) tests/run.sh integration

asan: deps
	$(Q)$(MAKE) --no-print-directory BUILD=build-asan SANITIZE=1 WERROR=1 CFLAGS="-O1 -g" all
	$(Q)BUILD=build-asan ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 tests/run.sh

demo: deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)BUILD=$(BUILD) tests/demo.sh

bench: deps
	$(Q)$(MAKE) --no-print-directory CFLAGS="-O2 -g" all
	$(Q)BUILD=$(BUILD) tests/bench/run.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD) build-asan -name '*.d' 2>/dev/null)
