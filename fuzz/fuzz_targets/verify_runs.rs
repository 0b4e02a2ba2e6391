#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferry_image_fuzz::verify_runs(data);
});

/// verify_runs_parallel spawns scoped threads; the join can return before
/// glibc has freed the thread's TLS-destructor list, which LeakSanitizer
/// then reports as a 32-byte leak from __cxa_thread_atexit_impl. That is
/// not a leak in ferry-image: suppress it here so `make fuzz` (which passes
/// no -detect_leaks=0) still catches real ones.
#[no_mangle]
pub extern "C" fn __lsan_default_suppressions() -> *const std::ffi::c_char {
    c"leak:__cxa_thread_atexit_impl\n".as_ptr()
}
