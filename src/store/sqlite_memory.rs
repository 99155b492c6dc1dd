//! SQLite's memory: where the process's SQLite allocates from (the store owns every use of
//! SQLite, its configuration included).

/// SQLite allocates from mimalloc too, without its memory statistics. Its default is glibc's
/// malloc behind a global mutex that counts every allocation: the request logs' inserts make
/// about six allocations a request, and glibc's malloc and free with that mutex cost about 2,600
/// instructions a request more (`python3 bench/run.py --instructions`). The
/// statistics serve only `sqlite3_memory_used` and the heap limits, which the gateway does not
/// use. Called by `main` before SQLite's first use (the process's first connection initializes
/// it); later, SQLite refuses it and keeps its defaults. The feature `system-allocator` leaves
/// SQLite on glibc's malloc, for heaptrack.
///
/// # Safety
///
/// No other thread may use SQLite meanwhile (`sqlite3_config` is not thread-safe).
pub unsafe fn sqlite_on_mimalloc() {
    #[cfg(not(feature = "system-allocator"))]
    {
        use std::ffi::{c_int, c_void};

        use libmimalloc_sys::{mi_free, mi_malloc, mi_realloc, mi_usable_size};
        use rusqlite::ffi;

        // SAFETY (all five): SQLite passes sizes it checked (positive, under 2 GiB) and
        // pointers it got from these same functions, as the sqlite3_mem_methods contract says.
        unsafe extern "C" fn malloc(n: c_int) -> *mut c_void {
            unsafe { mi_malloc(usize::try_from(n).unwrap_or(0)) }
        }
        unsafe extern "C" fn free(p: *mut c_void) {
            unsafe { mi_free(p) }
        }
        unsafe extern "C" fn realloc(p: *mut c_void, n: c_int) -> *mut c_void {
            unsafe { mi_realloc(p, usize::try_from(n).unwrap_or(0)) }
        }
        unsafe extern "C" fn size(p: *mut c_void) -> c_int {
            c_int::try_from(unsafe { mi_usable_size(p) }).unwrap_or(c_int::MAX)
        }
        unsafe extern "C" fn roundup(n: c_int) -> c_int {
            n.saturating_add(7) & !7
        }
        unsafe extern "C" fn init(_: *mut c_void) -> c_int {
            ffi::SQLITE_OK
        }
        unsafe extern "C" fn shutdown(_: *mut c_void) {}
        let methods = ffi::sqlite3_mem_methods {
            xMalloc: Some(malloc),
            xFree: Some(free),
            xRealloc: Some(realloc),
            xSize: Some(size),
            xRoundup: Some(roundup),
            xInit: Some(init),
            xShutdown: Some(shutdown),
            pAppData: std::ptr::null_mut(),
        };
        // SAFETY: no other thread uses SQLite (the caller's promise); SQLite copies `methods`
        // before returning. A refusal (SQLite already initialized) keeps its defaults, which
        // work as before.
        unsafe {
            ffi::sqlite3_config(ffi::SQLITE_CONFIG_MALLOC, &raw const methods);
            ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, c_int::from(false));
        }
    }
}
