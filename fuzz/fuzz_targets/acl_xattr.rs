//! Any bytes as a `system.posix_acl_*` value (clients send them): the ACL
//! decoder returns a valid ACL or an error, and a valid one decodes again
//! from its encoding and keeps the ACL rules' invariants.
#![no_main]
use hivefs_types::acl::{create_mode, Acl};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = Acl::decode(data) {
        assert_eq!(Acl::decode(&a.encode()), Ok(a.clone()));
        let mut c = a.clone();
        c.chmod(0o751);
        assert_eq!(c.mode(), 0o751);
        let i = create_mode(Some(&a), 0o100666, 0o022, false);
        assert_eq!(i.mode & !0o777, 0o100000);
        assert_eq!(i.mode & 0o777 & !0o666, 0);
    }
});
