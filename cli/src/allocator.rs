//! The process's allocator: jemalloc instead of glibc's malloc.
//!
//! `lanes dev` allocates and frees small buffers (JSON, HTTP heads, queue entries, store records)
//! from every runtime thread and the store's writer thread at once. Under a throughput run glibc's
//! malloc spent about a fifth of the runtime threads' samples in `_int_malloc`, `_int_free` and
//! `malloc_consolidate`. jemalloc serves the same pattern for less CPU, and the server's memory
//! with hundreds of stream readers stays where glibc's was with one arena (mimalloc, also tried,
//! held three to four times as much there).
//! `lanes bench throughput` and `lanes bench stream` measure both. jemalloc does not build for
//! MSVC, so a Windows build keeps the system allocator.

#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
