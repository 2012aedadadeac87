//! Requests on a running gateway's control socket: one line of text each.

/// What a control-socket client asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlRequest {
    /// `stats`: the gateway's counters.
    Stats,
    /// `sa list`: every SA with its state and counters.
    SaList,
    /// An SA or a tunnel by name.
    SaShow(String),
    /// `reload`: read the configuration file again and apply what changed.
    Reload,
}

/// Longest request line the socket reads.
pub const MAX_REQUEST: usize = 256;

/// Why a line is not a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// A line with nothing but whitespace.
    #[error("empty request; try stats, sa list, sa show NAME or reload")]
    Empty,
    /// A line longer than [`MAX_REQUEST`] bytes.
    #[error("request longer than {MAX_REQUEST} bytes")]
    TooLong,
    /// No request has these words (the first 40 printable characters).
    #[error("unknown request `{0}`; try stats, sa list, sa show NAME or reload")]
    Unknown(String),
}

impl ControlRequest {
    /// The request on `line` (words separated by any whitespace).
    pub fn parse(line: &str) -> Result<ControlRequest, RequestError> {
        if line.len() > MAX_REQUEST {
            return Err(RequestError::TooLong);
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [] => Err(RequestError::Empty),
            ["stats"] => Ok(ControlRequest::Stats),
            ["sa", "list"] => Ok(ControlRequest::SaList),
            ["sa", "show", name] => Ok(ControlRequest::SaShow((*name).to_owned())),
            ["reload"] => Ok(ControlRequest::Reload),
            _ => {
                // Quote at most a little of what was sent, printable only.
                let shown: String = line.chars().take(40).filter(|c| !c.is_control()).collect();
                Err(RequestError::Unknown(shown))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_garbage_is_refused() {
        assert_eq!(ControlRequest::parse(" stats \n"), Ok(ControlRequest::Stats));
        assert_eq!(ControlRequest::parse("sa list"), Ok(ControlRequest::SaList));
        assert_eq!(
            ControlRequest::parse("sa show a-b"),
            Ok(ControlRequest::SaShow("a-b".into()))
        );
        assert_eq!(ControlRequest::parse("reload"), Ok(ControlRequest::Reload));
        assert_eq!(ControlRequest::parse(""), Err(RequestError::Empty));
        assert!(matches!(
            ControlRequest::parse("sa show"),
            Err(RequestError::Unknown(_))
        ));
        assert_eq!(
            ControlRequest::parse(&"x".repeat(300)),
            Err(RequestError::TooLong)
        );
        let Err(RequestError::Unknown(shown)) = ControlRequest::parse("\x1b[2Jrm -rf") else {
            panic!("escape sequences are not a request");
        };
        assert!(!shown.contains('\x1b'));
    }
}
