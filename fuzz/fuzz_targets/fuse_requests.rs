//! Any bytes as a FUSE request from the kernel, over /dev/fuse (one
//! buffer) and over io_uring (the operation's header apart, at a split the
//! first byte chooses): decoding answers or refuses, and never panics or
//! reads past what arrived.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else { return };
    hivefs_fusewire::decode_any(rest, None);
    hivefs_fusewire::decode_any(rest, Some(usize::from(split)));
});
