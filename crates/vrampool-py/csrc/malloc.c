/* vrampool_torch_malloc, the entry PyTorch's CUDAPluggableAllocator calls, and the C++ exception
 * it throws on failure under `raise_on_failure` (vrampool_malloc, for every other caller, is Rust
 * and never throws).
 *
 * The throw happens here, in C, in the outermost frame of the module, after the Rust work
 * (vrampool_torch_malloc_or_message) has returned: the exception never unwinds through a Rust frame.
 * That matters because libstdc++'s __cxa_throw unwinds with libgcc's unwinder, while the
 * portable wheel (maturin --zig) links zig's own libunwind into the module, which Rust's
 * personality routine would call with libgcc's context: a crash. A C frame has no personality
 * routine; -fexceptions (build.rs) gives it the unwind table that libgcc's unwinder reads.
 *
 * The exception must be libstdc++'s std::runtime_error: PyTorch is built against libstdc++ and
 * catches std::exception. A C++ compiler here would not do: under maturin --zig it is zig c++,
 * whose std::runtime_error is libc++'s, a type that libstdc++'s catch clauses do not match. So
 * libstdc++ throws it itself: std::__throw_runtime_error(const char*) constructs the exception
 * and throws it, so nothing here knows its size or layout. That function is in libstdc++'s
 * exported ABI since GLIBCXX_3.4 and its own headers call it from inline code, so every
 * libstdc++ has it. It is looked up in the libstdc++ already in the process (PyTorch's), never
 * linked: the module loads without a C++ runtime (cuda-python users) and needs none. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

/* Room for the message of a thrown exception; longer messages are cut. */
#define MESSAGE_ROOM 1024

/* The Rust side (c_abi.rs): the pointer, or null; on a failure under `raise_on_failure` it also
 * writes the exception's message, NUL-terminated, into `message` (`capacity` bytes). */
void *vrampool_torch_malloc_or_message(size_t size, int device, void *stream, char *message, size_t capacity);

typedef void (*throw_runtime_error_fn)(const char *what);

/* libstdc++'s std::__throw_runtime_error, or null where libstdc++ is not loaded. The handle is
 * closed at once: RTLD_NOLOAD only adds a reference to a library that whoever loaded it (PyTorch,
 * which links it) keeps loaded. */
static throw_runtime_error_fn libstdcxx_throw_runtime_error(void) {
    void *lib = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) {
        return NULL;
    }
    throw_runtime_error_fn fn = (throw_runtime_error_fn)dlsym(lib, "_ZSt21__throw_runtime_errorPKc");
    dlclose(lib);
    return fn;
}

/* Whether a failed vrampool_torch_malloc can throw in this process (read by abi_raise_on_failure). */
int vrampool_cxx_can_throw(void) {
    return libstdcxx_throw_runtime_error() != NULL;
}

void *vrampool_torch_malloc(size_t size, int device, void *stream) {
    char message[MESSAGE_ROOM];
    message[0] = '\0';
    void *ptr = vrampool_torch_malloc_or_message(size, device, stream, message, sizeof message);
    if (ptr == NULL && message[0] != '\0') {
        throw_runtime_error_fn throw_runtime_error = libstdcxx_throw_runtime_error();
        if (throw_runtime_error != NULL) {
            throw_runtime_error(message); /* does not return */
        }
    }
    return ptr;
}
