//! Any 24 bytes: the header decoder returns a header within the limits or an error.
#![no_main]
use hivefs_proto::{FrameHeader, HEADER_LEN, MAX_BODY_LEN, MAX_PAYLOAD_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER_LEN {
        return;
    }
    let b: [u8; HEADER_LEN] = data[..HEADER_LEN].try_into().unwrap();
    if let Ok(h) = FrameHeader::decode(&b) {
        assert!(h.body_len <= MAX_BODY_LEN && h.payload_len <= MAX_PAYLOAD_LEN);
        assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
    }
});
