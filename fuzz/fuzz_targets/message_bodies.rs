//! Any bytes as a request, response or handshake body of every service:
//! an error or a value that re-encodes to the same message.
#![no_main]
use hivefs_proto::{decode_body, encode_body, Hello, Request, Response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = decode_body::<Request>(data) {
        assert_eq!(decode_body::<Request>(&encode_body(&r)).unwrap(), r);
    }
    if let Ok(r) = decode_body::<Response>(data) {
        assert_eq!(decode_body::<Response>(&encode_body(&r)).unwrap(), r);
    }
    if let Ok(h) = decode_body::<Hello>(data) {
        assert_eq!(decode_body::<Hello>(&encode_body(&h)).unwrap(), h);
    }
});
