# Sampan build. `make` builds build/sampan; `make test` runs the whole suite.
#
#   make                     release build (-O2, one binary for every x86-64:
#                            SIMD files get their own -m flags and are picked
#                            at run time from cpuid)
#   make SANITIZER=1         ASan + UBSan build in build-san/
#   make fuzz                libFuzzer targets (clang) in build-fuzz/
#   make unit                the C unit-test runner (build/test_unit)
#   make test                everything tests/run.sh runs (C units, sanitizer
#                            units, NumPy reference, CLI checks)
#   make check-layers        the layers of docs/design.md: the include table and no
#                            circle of objects (scripts/check-includes.sh, check-cycles.py)
#   make ARCH=arm64 unit-arm64
#                            arm64 cross build (CROSS=aarch64-linux-gnu-): NEON kernels,
#                            build-arm64/test_unit_arm64 (kernel and engine suites; run by
#                            tests/arm64.sh under qemu-aarch64)
#   make clean

CC      ?= cc
PYTHON  ?= /usr/bin/python3

# arm64 cross build: Debian's gcc-aarch64-linux-gnu (and two arm64 libraries, see unit-arm64).
ifeq ($(ARCH),arm64)
CROSS   ?= aarch64-linux-gnu-
CC       = $(CROSS)gcc
BUILD   ?= build-arm64
endif

ifeq ($(FUZZ),1)
# libFuzzer builds (clang): every object instrumented, the targets linked with the fuzzer main.
CC       = clang
BUILD   ?= build-fuzz
SANFLAGS = -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
OPT      = -O1 -g -DSP_DEBUG
else ifeq ($(SANITIZER),1)
BUILD   ?= build-san
SANFLAGS = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
OPT      = -O1 -g -DSP_DEBUG
else
BUILD   ?= build
SANFLAGS =
OPT      = -O2 -g
endif

WARN     = -Wall -Wextra -Wshadow -Wstrict-prototypes -Wvla -Wno-unused-parameter -Werror
CPPFLAGS = -Iinclude -Isrc -D_GNU_SOURCE
CFLAGS   = -std=c11 $(OPT) $(WARN) $(SANFLAGS) -pthread -fvisibility=hidden
LDFLAGS  = $(SANFLAGS) -pthread
LDLIBS   = -lpcre2-8 -levent_core -levent_openssl -lhttp_parser -ljansson -lssl -lcrypto -lm \
           -lnghttp2 -lprotobuf-c -lcurl -lyaml -lxml2 -ljpeg -lpng16

# Per-ISA flags: only these files may use the instructions, the dispatcher
# decides at run time whether they are called.
AVX2_FLAGS   = -mavx2 -mfma -mf16c
AVXVNNI_FLAGS = $(AVX2_FLAGS) -mavxvnni
AVX512_FLAGS = -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq \
               -mavx512vnni -mavx512bf16
AMX_FLAGS    = $(AVX512_FLAGS) -mamx-tile -mamx-int8

# The SIMD files of the other architecture are never compiled.
ifeq ($(ARCH),arm64)
SIMD_SKIP := src/kernels/cpu/avx% src/kernels/cpu/amx%
else
SIMD_SKIP := src/kernels/cpu/neon%
endif
LIB_SRC  := $(filter-out $(SIMD_SKIP),$(sort $(shell find src -name '*.c' ! -path 'src/main.c')))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(sort $(wildcard tests/unit/*.c))
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

AVX2_OBJ   := $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/kernels/cpu/avx2*.c))
AVXVNNI_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/kernels/cpu/avxvnni*.c))
AVX512_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/kernels/cpu/avx512*.c))
AMX_OBJ    := $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/kernels/cpu/amx*.c))
$(AVX2_OBJ):   ISA_FLAGS = $(AVX2_FLAGS)
$(AVXVNNI_OBJ): ISA_FLAGS = $(AVXVNNI_FLAGS)
$(AVX512_OBJ): ISA_FLAGS = $(AVX512_FLAGS)
$(AMX_OBJ):    ISA_FLAGS = $(AMX_FLAGS)
# arm64: neon.c is base ARMv8-A; the SDOT file alone may use the dot-product extension.
$(BUILD)/src/kernels/cpu/neon_dotprod.o: ISA_FLAGS = -march=armv8.2-a+dotprod
ifeq ($(ARCH),arm64)
# Debian's aarch64 gcc 12 stops with an internal compiler error (vect_transform_reduction) in
# reduction loops of several tests (test_kernels.c, test_q32.c); tests need no vectorising.
$(BUILD)/tests/unit/%.o: ISA_FLAGS = -fno-tree-vectorize
endif

.PHONY: all unit test clean check-layers check-includes demo fuzz
all: $(BUILD)/sampan

# libxml2 keeps its headers in a folder of their own (the S3 repository's listings).
XML_CFLAGS := $(shell pkg-config --cflags libxml-2.0 2>/dev/null || echo -I/usr/include/libxml2)
$(BUILD)/src/serving/s3repo.o: CPPFLAGS += $(XML_CFLAGS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(ISA_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libsampan.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/sampan: $(BUILD)/src/main.o $(BUILD)/libsampan.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# Test objects see everything: tests/unit/*.c link against the whole library.
$(BUILD)/test_unit: $(TEST_OBJ) $(BUILD)/libsampan.a
	$(CC) $(LDFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libsampan.a $(LDLIBS)

# Fake NVML libraries that tests/unit/test_device.c dlopens from test_unit's directory
# (never instrumented: they stand in for a vendor library).
FAKE_NVML := $(BUILD)/libfake_nvml.so $(BUILD)/libfake_nvml_nosym.so
$(BUILD)/libfake_nvml.so: tests/fake/fake_nvml.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g $(WARN) -fPIC -shared -o $@ $<
$(BUILD)/libfake_nvml_nosym.so: tests/fake/fake_nvml.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g $(WARN) -fPIC -shared -DFAKE_NVML_NO_MEMINFO -o $@ $<

# The status page (GET /, src/api/status_page.c) is compiled in: tools/embed.py
# turns the HTML into a byte array plus the CSP hashes of its inline script and
# style, in $(BUILD)/gen/ (generated on every clean build, never committed).
$(BUILD)/gen/status_page_html.h: src/api/status_page.html tools/embed.py
	@mkdir -p $(dir $@)
	$(PYTHON) tools/embed.py $< $@ sp_status_page
$(BUILD)/src/api/status_page.o: $(BUILD)/gen/status_page_html.h
$(BUILD)/src/api/status_page.o: CPPFLAGS += -I$(BUILD)/gen

# The gRPC front end (src/api/grpc*.c, docs/grpc.md): protoc-c (Debian's
# protobuf-c-compiler) turns proto/grpc_service.proto, proto/health.proto and
# proto/model_config.proto (a model's config, config.pbtxt; grpc_service.proto imports it)
# into C in $(BUILD)/gen/ on every clean build; the generated code is never committed.
PROTOS    := grpc_service health model_config
PROTO_OBJ := $(PROTOS:%=$(BUILD)/gen/%.pb-c.o)
$(BUILD)/libsampan.a: $(PROTO_OBJ)
$(BUILD)/gen/%.pb-c.c: proto/%.proto
	@mkdir -p $(dir $@)
	protoc-c --c_out=$(BUILD)/gen -Iproto $<
$(BUILD)/gen/grpc_service.pb-c.c: proto/model_config.proto
$(BUILD)/gen/%.pb-c.h: $(BUILD)/gen/%.pb-c.c
	@test -f $@ && touch $@
$(BUILD)/gen/%.pb-c.o: $(BUILD)/gen/%.pb-c.c $(BUILD)/gen/%.pb-c.h $(BUILD)/gen/model_config.pb-c.h
	$(CC) $(CPPFLAGS) -I$(BUILD)/gen $(CFLAGS) -c $< -o $@
.PRECIOUS: $(BUILD)/gen/%.pb-c.c $(BUILD)/gen/%.pb-c.h
PBTXT_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/serving/pbtxt*.c src/serving/repo_pbtxt*.c \
                                                    src/api/model_config*.c tests/unit/test_pbtxt*.c \
                                                    tests/fuzz/fuzz_pbtxt*.c))
$(PBTXT_OBJ): $(BUILD)/gen/model_config.pb-c.h
$(PBTXT_OBJ): CPPFLAGS += -I$(BUILD)/gen
GRPC_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard src/api/grpc*.c tests/fuzz/fuzz_grpc*.c))
$(GRPC_OBJ): $(PROTOS:%=$(BUILD)/gen/%.pb-c.h)
$(GRPC_OBJ): CPPFLAGS += -I$(BUILD)/gen

# The newer tokenizer vocabularies ship xz-compressed (tests/data/tokenizer-2026/README.md);
# the tests read them unpacked from build/testdata/ (one copy for every build flavour).
TOK2026 := $(patsubst tests/data/tokenizer-2026/%.xz,build/testdata/%,\
             $(wildcard tests/data/tokenizer-2026/*.gguf.xz))
build/testdata/%.gguf: tests/data/tokenizer-2026/%.gguf.xz
	@mkdir -p $(dir $@)
	xz -dc $< > $@.tmp && mv $@.tmp $@

unit: $(BUILD)/test_unit $(BUILD)/sampan $(FAKE_NVML) $(TOK2026)

# The arm64 unit runner (`make ARCH=arm64 unit-arm64`): the kernel and engine suites only,
# linked against the floors below the server (core, kernels, gguf, text, chat, constrain,
# engine, and the model-file decryption and GPU loader the engine calls) in an archive of their
# own. The engine's tokenizer and decryption need arm64 PCRE2 and libcrypto (Debian multiarch:
# libpcre2-dev:arm64, libssl-dev:arm64, which scripts/deps.sh --test installs); the HTTP, JSON
# and gRPC libraries of the server are not needed (statically, only the objects the tests reach
# are linked), so no other arm64 package is.
ARM64_FLOORS := core kernels gguf text chat constrain engine crypto cuda
ARM64_LIB_OBJ := $(filter $(foreach f,$(ARM64_FLOORS),$(BUILD)/src/$(f)/%),$(LIB_OBJ))
ARM64_TESTS := runner kernels kquants kquants2 q32 attn model forward
ARM64_TEST_OBJ := $(patsubst %,$(BUILD)/tests/unit/test_%.o,$(filter-out runner,$(ARM64_TESTS))) \
                  $(BUILD)/tests/unit/runner.o
$(BUILD)/libsampan_floors.a: $(ARM64_LIB_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^
$(BUILD)/test_unit_arm64: $(ARM64_TEST_OBJ) $(BUILD)/libsampan_floors.a
	$(CC) $(LDFLAGS) -o $@ $^ -lpcre2-8 -lcrypto -lm
.PHONY: unit-arm64
unit-arm64: $(BUILD)/test_unit_arm64


# Backends (docs/backends.md): plugins the server dlopens from $(BUILD)/backends/, never linked
# into sampan. backends/NAME.c becomes libsampan_NAME.so, linked with BACKEND_LIBS_NAME. Each
# compiles backends/common.c into itself (hidden symbols) and exports only sp_backend_init.
# They share the build's sanitizer flags: an ASan sampan loads ASan backends.
# The xgboost backend needs Debian's libxgboost-dev (scripts/deps.sh installs it); without the
# header it is not built and tests/unit/test_backends.c says it skipped.
XGBOOST_HEADER ?= /usr/include/xgboost/c_api.h
BACKEND_CFLAGS = -std=c11 $(OPT) $(WARN) $(SANFLAGS) -pthread -fPIC -fvisibility=hidden
BACKEND_SRC := $(filter-out backends/common.c,$(wildcard backends/*.c))
ifeq ($(wildcard $(XGBOOST_HEADER)),)
BACKEND_SRC := $(filter-out backends/xgboost.c,$(BACKEND_SRC))
endif
BACKENDS := $(patsubst backends/%.c,$(BUILD)/backends/libsampan_%.so,$(BACKEND_SRC))
BACKEND_LIBS_xgboost = -lxgboost
$(BUILD)/backends/libsampan_%.so: backends/%.c backends/common.c backends/common.h \
                                  include/sampan/backend.h
	@mkdir -p $(dir $@)
	$(CC) -Iinclude -D_GNU_SOURCE $(BACKEND_CFLAGS) -shared -o $@ $< backends/common.c \
	    $(SANFLAGS) $(BACKEND_LIBS_$*) -ljansson -lm
all unit: $(BACKENDS)

# The ONNX backend (docs/backends.md, docs/design.md): backends/onnx/*.c and the protoc-c
# code of proto/onnx.proto (generated in $(BUILD)/gen/, never committed) in one plugin, so that
# neither the graph runtime nor libprotobuf-c's ONNX tables are in the sampan binary.
ONNX_SRC := $(wildcard backends/onnx/*.c)
# oneDNN (Debian's libdnnl-dev, built on OpenMP) runs the heavy operators when it is installed
# (backends/onnx/dnnl.c); without it the plugin is our own runtime only.
ifneq ($(wildcard /usr/include/oneapi/dnnl/dnnl.h),)
ONNX_DNNL_CFLAGS := -DSP_HAVE_DNNL
ONNX_DNNL_LIBS := -ldnnl -lgomp
endif
$(BUILD)/gen/onnx.pb-c.c: proto/onnx.proto
	@mkdir -p $(dir $@)
	protoc-c --c_out=$(BUILD)/gen -Iproto $<
$(BUILD)/gen/onnx.pb-c.h: $(BUILD)/gen/onnx.pb-c.c
	@test -f $@ && touch $@
$(BUILD)/backends/libsampan_onnx.so: $(ONNX_SRC) $(wildcard backends/onnx/*.h) backends/common.c \
                                     backends/common.h include/sampan/backend.h \
                                     $(BUILD)/gen/onnx.pb-c.c $(BUILD)/gen/onnx.pb-c.h
	@mkdir -p $(dir $@)
	$(CC) -Iinclude -I$(BUILD)/gen -D_GNU_SOURCE $(BACKEND_CFLAGS) $(ONNX_DNNL_CFLAGS) -shared -o $@ \
	    $(ONNX_SRC) $(BUILD)/gen/onnx.pb-c.c backends/common.c $(SANFLAGS) -lprotobuf-c -ljansson \
	    $(ONNX_DNNL_LIBS) -lm
all unit: $(BUILD)/backends/libsampan_onnx.so
# Its fuzz target compiles the runtime in (not the plugin glue) instead of linking libsampan.a.
build-fuzz/fuzz_onnx: tests/fuzz/fuzz_onnx.c $(filter-out backends/onnx/backend.c backends/onnx/gpu.c,$(ONNX_SRC)) \
                      $(wildcard backends/onnx/*.h) $(BUILD)/gen/onnx.pb-c.c $(BUILD)/gen/onnx.pb-c.h
	$(CC) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -std=c11 -O1 -g \
	    $(WARN) -D_GNU_SOURCE -Ibackends/onnx -I$(BUILD)/gen -o $@ tests/fuzz/fuzz_onnx.c \
	    $(filter-out backends/onnx/backend.c backends/onnx/gpu.c,$(ONNX_SRC)) $(BUILD)/gen/onnx.pb-c.c -lprotobuf-c -lm

# Batch-1 products against the memory read limit through the engine's pool and split
# (bench/decode_bench.c; docs/design.md). A bench tool, not part of `all`.
$(BUILD)/decode_bench: bench/decode_bench.c bench/read_sum.h $(BUILD)/libsampan.a
	$(CC) $(CPPFLAGS) -std=c11 -O2 -g $(WARN) -march=native -pthread -o $@ $< $(BUILD)/libsampan.a $(LDLIBS)

# Whole decode steps of a real model against a plain read of the bytes they stream, paired
# step by step (bench/step_bench.c; BENCHMARKS.md). A bench tool, not part of `all`.
$(BUILD)/step_bench: bench/step_bench.c bench/read_sum.h $(BUILD)/libsampan.a
	$(CC) $(CPPFLAGS) -std=c11 -O2 -g $(WARN) $(SANFLAGS) -march=native -pthread -o $@ $< \
	    $(BUILD)/libsampan.a $(LDLIBS)

# The quantized gemms at a prefill work item's shape, every type at every x86 level the CPU has,
# each against the kernel its file kept for A/B (bench/qgemm_shape_bench.c). x86-64 only.
$(BUILD)/qgemm_shape_bench: bench/qgemm_shape_bench.c bench/qbench.h $(BUILD)/libsampan.a
	$(CC) $(CPPFLAGS) -std=c11 -O2 -g $(WARN) $(SANFLAGS) -pthread -o $@ $< $(BUILD)/libsampan.a \
	    $(LDLIBS)

# How close the AVX2 Q8_0 prefill gemm is to the instruction set's limit on this CPU (inline-asm
# throughput loops next to the kernel; bench/q8_ceiling.c, docs/design.md). x86-64 only.
$(BUILD)/q8_ceiling: bench/q8_ceiling.c $(BUILD)/libsampan.a
	$(CC) $(CPPFLAGS) -std=c11 -O2 -g $(WARN) -pthread -o $@ $< $(BUILD)/libsampan.a $(LDLIBS)

# Fraud-scoring benchmark tools (bench/fraud.sh, bench/grpc.sh): KServe v2 load generators for
# REST (kserve_load) and gRPC (grpc_load: nghttp2 and the protoc-c code of the server's .proto)
# and the XGBoost C API floor. Not part of `all`; xgb_floor needs libxgboost-dev like the
# xgboost backend.
.PHONY: bench-tools
bench-tools: $(BUILD)/kserve_load $(BUILD)/grpc_load $(BUILD)/tcp_floor \
             $(if $(wildcard /usr/include/xgboost/c_api.h),$(BUILD)/xgb_floor)
$(BUILD)/grpc_load: bench/grpc_load.c bench/loadgen.h $(BUILD)/gen/grpc_service.pb-c.c $(BUILD)/gen/grpc_service.pb-c.h \
                    $(BUILD)/gen/model_config.pb-c.c $(BUILD)/gen/model_config.pb-c.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g $(WARN) -D_GNU_SOURCE -I$(BUILD)/gen -o $@ $< \
	    $(BUILD)/gen/grpc_service.pb-c.c $(BUILD)/gen/model_config.pb-c.c -lnghttp2 -lprotobuf-c -lm
$(BUILD)/kserve_load: bench/kserve_load.c bench/loadgen.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g $(WARN) -D_GNU_SOURCE -o $@ $< -lm
$(BUILD)/tcp_floor: bench/tcp_floor.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g $(WARN) -D_GNU_SOURCE -o $@ $<
$(BUILD)/xgb_floor: bench/xgb_floor.c bench/loadgen.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g $(WARN) -D_GNU_SOURCE -o $@ $< -lxgboost -ljansson -lm

# CUDA backend (docs/cuda.md). `make cuda` builds $(CUDA_BUILD)/libsampan_cuda.so with nvcc
# (sm_80, sm_89, sm_90 and sm_90 PTX; linked against cudart and cuBLAS), which sampan dlopens
# at run time from its own directory: sampan itself never links CUDA, and plain `make` needs
# no nvcc. `make cuda-tests` builds, with the C compiler only, the GPU kernel test, the GPU
# benchmark and the host tests with their fake CUDA library (tests/gpu/, bench/gpu/).
# `make cuda-check CUDA_ARCHS=80` only compiles (what CI runs, one arch to stay quick).
NVCC       ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCHS ?= 80 89 90
CUDA_PTX   ?= 90
CUDA_BUILD ?= $(BUILD)
CUDA_COMMA  := ,
CUDA_GENCODE = $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
               $(foreach a,$(CUDA_PTX),-gencode arch=compute_$(a)$(CUDA_COMMA)code=compute_$(a))
NVCCFLAGS  = -std=c++17 -O2 -g -Iinclude -Isrc $(CUDA_GENCODE) -Xcompiler -fPIC,-fvisibility=hidden \
             -Xcompiler -Wall,-Wextra,-Wno-unused-parameter -Werror all-warnings
CUDA_OBJ  := $(patsubst src/cuda/%.cu,$(CUDA_BUILD)/cuda/%.o,$(wildcard src/cuda/*.cu))
.PHONY: cuda cuda-check cuda-tests
cuda: $(CUDA_BUILD)/libsampan_cuda.so cuda-tests
cuda-check: $(CUDA_OBJ)
$(CUDA_BUILD)/cuda/%.o: src/cuda/%.cu src/cuda/cuda_api.h src/cuda/cuda_common.h \
                        src/cuda/kernels_cu.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
$(CUDA_BUILD)/libsampan_cuda.so: $(CUDA_OBJ)
	$(NVCC) -shared -o $@ $^ -L$(CUDA_HOME)/lib64 -Xlinker -rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart
GPU_TEST_FLAGS = $(CPPFLAGS) -std=c11 -O2 -g $(WARN) $(SANFLAGS) -pthread
cuda-tests: $(BUILD)/gpu_kernel_test $(BUILD)/gpu_bench $(BUILD)/test_cuda_host \
            $(BUILD)/libfake_cuda.so
$(BUILD)/gpu_kernel_test: tests/gpu/kernel_test.c $(BUILD)/libsampan.a
	$(CC) $(GPU_TEST_FLAGS) -o $@ $< $(BUILD)/libsampan.a $(LDLIBS)
# The host test builds its random models with the unit tests' shared writer (testmodel.c).
$(BUILD)/test_cuda_host: tests/gpu/host_test.c tests/unit/testmodel.c tests/unit/testmodel.h \
                         $(BUILD)/libsampan.a
	$(CC) $(GPU_TEST_FLAGS) -Itests/unit -o $@ tests/gpu/host_test.c tests/unit/testmodel.c \
	    $(BUILD)/libsampan.a $(LDLIBS)
$(BUILD)/gpu_bench: bench/gpu/gpu_bench.c $(BUILD)/libsampan.a
	$(CC) $(GPU_TEST_FLAGS) -o $@ $< $(BUILD)/libsampan.a $(LDLIBS)
# The host emulation of the CUDA library (never instrumented: it stands in for a vendor library).
$(BUILD)/libfake_cuda.so: tests/gpu/fake_cuda.c src/cuda/cuda_api.h src/cuda/cuda_common.h
	@mkdir -p $(dir $@)
	$(CC) -Iinclude -Isrc -std=c11 -O1 -g $(WARN) -fPIC -shared -o $@ $< -lm

# The ONNX backend's GPU executor (docs/cuda.md "ONNX models on the GPU"): backends/onnx/cuda/exec.c (host C: shapes,
# memory pool, convolution plans) with dev.cu (kernels, cuDNN, cuBLAS) in
# $(CUDA_BUILD)/libsampan_onnx_cuda.so, which the ONNX plugin dlopens for KIND_GPU models; the same
# exec.c with the host emulation tests/gpu/fake_onnx_dev.c in $(BUILD)/libfake_onnx_cuda.so, built
# with the plugin, so the suite runs the plugin's GPU path without a GPU (tests/py/test_onnx_gpu.py).
# Without cuDNN (it ships apart from the toolkit) `make cuda` still builds the LLM library and says
# that this one was left out.
ONNX_CUDA_HDR := backends/onnx/gpu_api.h backends/onnx/cuda/dev.h backends/onnx/cuda/half.h
CUDNN_H := $(firstword $(wildcard $(CUDA_HOME)/include/cudnn.h /usr/include/cudnn.h \
                                  /usr/include/x86_64-linux-gnu/cudnn.h))
.PHONY: onnx-cuda-no-cudnn
cuda: $(if $(CUDNN_H),$(CUDA_BUILD)/libsampan_onnx_cuda.so,onnx-cuda-no-cudnn)
cuda-check: $(if $(CUDNN_H),$(CUDA_BUILD)/onnx_cuda/dev.o,onnx-cuda-no-cudnn)
onnx-cuda-no-cudnn:
	@echo "libsampan_onnx_cuda.so left out: no cudnn.h in $(CUDA_HOME)/include or /usr/include" \
	      "(ONNX KIND_GPU models will fail to load with the reason)"
$(CUDA_BUILD)/onnx_cuda/dev.o: backends/onnx/cuda/dev.cu $(ONNX_CUDA_HDR)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
$(CUDA_BUILD)/onnx_cuda/exec.o: backends/onnx/cuda/exec.c $(ONNX_CUDA_HDR)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g $(WARN) -D_GNU_SOURCE -fPIC -fvisibility=hidden -c $< -o $@
$(CUDA_BUILD)/libsampan_onnx_cuda.so: $(CUDA_BUILD)/onnx_cuda/dev.o $(CUDA_BUILD)/onnx_cuda/exec.o
	$(NVCC) -shared -o $@ $^ -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -Xlinker -rpath,$(CUDA_HOME)/lib64 \
	    -Xlinker -rpath,$(CUDA_HOME)/lib -lcudnn -lcublas -lcudart
# The host emulation (never instrumented: it stands in for a vendor library, as libfake_cuda.so).
$(BUILD)/libfake_onnx_cuda.so: tests/gpu/fake_onnx_dev.c backends/onnx/cuda/exec.c $(ONNX_CUDA_HDR)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g $(WARN) -D_GNU_SOURCE -fPIC -shared -fvisibility=hidden -o $@ \
	    tests/gpu/fake_onnx_dev.c backends/onnx/cuda/exec.c -lm
all unit: $(BUILD)/libfake_onnx_cuda.so

# `make fuzz` builds the libFuzzer targets in build-fuzz/ (see docs/operations.md).
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,build-fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))
fuzz:
	$(MAKE) FUZZ=1 $(FUZZ_TARGETS)

build-fuzz/fuzz_%: build-fuzz/tests/fuzz/fuzz_%.o build-fuzz/libsampan.a
	$(CC) -fsanitize=fuzzer,address,undefined -o $@ $^ $(LDLIBS) -pthread

test:
	./tests/run.sh

demo: $(BUILD)/sampan
	./$(BUILD)/sampan run -m models/stories260K.gguf -p "Once upon a time" -n 200

check-layers: $(BUILD)/libsampan.a
	./scripts/check-includes.sh
	$(PYTHON) scripts/check-cycles.py $(BUILD)

check-includes:
	./scripts/check-includes.sh

clean:
	rm -rf build build-san build-fuzz build-arm64

-include $(LIB_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(BUILD)/src/main.d
# The fuzz targets' objects are intermediate (deleted after linking); their
# dependency files still make a changed header (tests/fuzz/serve_harness.h) rebuild them.
-include $(patsubst build-fuzz/%,build-fuzz/tests/fuzz/%.d,$(FUZZ_TARGETS))
