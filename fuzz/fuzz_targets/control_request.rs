//! Control-socket requests (`ike_stub::ControlRequest::parse`): any bytes,
//! as `str` when they are UTF-8 and lossily converted otherwise (as the
//! socket reads them), are a request or an error. A request parses again
//! from its canonical form; an error quotes at most 40 characters and no
//! control characters (it is echoed to a terminal).
#![no_main]

use ike_stub::{ControlRequest, RequestError};
use libfuzzer_sys::fuzz_target;

fn check(line: &str) {
    match ControlRequest::parse(line) {
        Ok(request) => {
            assert!(line.len() <= ike_stub::request::MAX_REQUEST);
            let canonical = match &request {
                ControlRequest::Stats => "stats".to_owned(),
                ControlRequest::SaList => "sa list".to_owned(),
                ControlRequest::SaShow(name) => {
                    assert!(!name.is_empty() && !name.contains(char::is_whitespace));
                    format!("sa show {name}")
                }
                ControlRequest::Reload => "reload".to_owned(),
            };
            assert_eq!(ControlRequest::parse(&canonical), Ok(request));
        }
        Err(RequestError::Unknown(shown)) => {
            assert!(shown.chars().count() <= 40, "{shown:?}");
            assert!(!shown.chars().any(char::is_control), "{shown:?}");
        }
        Err(RequestError::TooLong) => assert!(line.len() > ike_stub::request::MAX_REQUEST),
        Err(RequestError::Empty) => assert!(line.trim().is_empty()),
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(line) = std::str::from_utf8(data) {
        check(line);
    }
    check(&String::from_utf8_lossy(data));
});
