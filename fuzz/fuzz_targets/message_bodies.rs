//! Any bytes as a request (also after an envelope), response or handshake
//! body of every service:
//! an error or a value that re-encodes to the same message.
#![no_main]
use hivefs_proto::{decode_body, decode_request, encode_body, encode_request, Hello, Request, Response, FLAG_ENVELOPE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = decode_body::<Request>(data) {
        assert_eq!(decode_body::<Request>(&encode_body(&r)).unwrap(), r);
    }
    if let Ok((env, r)) = decode_request(FLAG_ENVELOPE, data) {
        let (flags, body) = encode_request(&env, &r);
        assert_eq!(decode_request(flags, &body).unwrap(), (env, r));
    }
    if let Ok(r) = decode_body::<Response>(data) {
        assert_eq!(decode_body::<Response>(&encode_body(&r)).unwrap(), r);
    }
    if let Ok(h) = decode_body::<Hello>(data) {
        assert_eq!(decode_body::<Hello>(&encode_body(&h)).unwrap(), h);
    }
});
