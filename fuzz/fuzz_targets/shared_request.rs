//! The shared engine server's request parser (`accel::shared::wire`): any
//! bytes a tenant sends on the control socket, or writes into a request
//! ring entry, are a request or a typed error, never a panic. A parsed
//! request re-encodes to one that parses the same; a burst never yields
//! data past its message; an entry whose regions fit its data passes the
//! descriptor check every engine relies on.
#![no_main]

use accel::shared::wire::{self, BurstIter, Reply, Request, RequestEntry, MAX_KEY, REQUEST_LEN};
use libfuzzer_sys::fuzz_target;

fn check_entry(e: &RequestEntry) {
    let mut b = [0u8; REQUEST_LEN];
    e.encode(&mut b);
    assert_eq!(RequestEntry::decode(&b).as_ref(), Ok(e));
    if e.regions_fit() {
        assert!(e.desc.validate(e.data_len as usize).is_ok(), "{e:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    match Request::parse(data) {
        Ok(Request::Submit { count, body }) => {
            let mut seen = 0usize;
            for item in BurstIter::requests(count, body) {
                let Ok((entry, bytes)) = item else { break };
                assert_eq!(bytes.len(), entry.data_len as usize);
                seen += REQUEST_LEN + bytes.len();
                assert!(seen <= body.len());
                check_entry(&entry);
            }
        }
        Ok(Request::Register {
            algorithm,
            esn,
            enc_key,
            auth_key,
        }) => {
            assert!(enc_key.len() <= MAX_KEY && auth_key.len() <= MAX_KEY);
            let mut again = Vec::new();
            wire::register(&mut again, algorithm, esn, enc_key, auth_key);
            assert_eq!(
                Request::parse(&again),
                Ok(Request::Register {
                    algorithm,
                    esn,
                    enc_key,
                    auth_key
                })
            );
        }
        Ok(Request::Attach {
            transport,
            entries,
            slot_size,
            version,
        }) => {
            let mut again = Vec::new();
            wire::attach(&mut again, transport, entries, slot_size);
            assert_eq!(
                Request::parse(&again),
                Ok(Request::Attach {
                    transport,
                    entries,
                    slot_size,
                    version
                })
            );
        }
        Ok(Request::Release { handle, mark }) => {
            let mut again = Vec::new();
            wire::release(&mut again, handle, mark);
            assert_eq!(Request::parse(&again), Ok(Request::Release { handle, mark }));
        }
        Ok(Request::Stats | Request::Detach) => assert_eq!(data.len(), 1),
        Err(e) => {
            let _ = e.to_string();
        }
    }
    // The same bytes as a ring entry, and as a reply (the tenant's parser).
    if data.len() >= REQUEST_LEN {
        if let Ok(entry) = RequestEntry::decode(&data[..REQUEST_LEN]) {
            check_entry(&entry);
        }
    }
    if let Ok(reply) = Reply::parse(data) {
        let mut again = Vec::new();
        reply.emit(&mut again);
        if !matches!(reply, Reply::Completions { .. }) {
            assert_eq!(Reply::parse(&again), Ok(reply));
        }
    }
});
