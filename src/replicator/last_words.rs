//! The replicator's last words: the error that ends it, written where the kubelet reads a
//! container's termination message, so the operator can name it in the flow's `Ready`
//! condition (`operator::unready`) instead of "0/1 replicator pods ready".
//!
//! The pod template names the file in [`ENV`] (the kubelet's `/dev/termination-log`); outside
//! a pod nothing is written. The kubelet keeps at most 4096 bytes; the error's text may repeat
//! what a broker said, so it is cut far shorter here, on a character boundary.

use std::panic::PanicHookInfo;

/// The environment variable naming the termination message file.
pub const ENV: &str = "MIRRORFLOW_TERMINATION_LOG";
/// Bytes of last words kept: one line of a condition message.
const MAX_BYTES: usize = 1024;

/// Writes `result`'s error, if any, as the container's termination message and returns it.
pub fn record<T>(result: anyhow::Result<T>) -> anyhow::Result<T> {
    if let Err(e) = &result {
        write(&format!("{e:#}"));
    }
    result
}

/// Also writes a panic's message before the default hook reports it: a panic that ends the
/// process leaves the same trace as an error.
pub fn on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
        let what = (info.payload().downcast_ref::<&str>().copied())
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic");
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        write(&format!("panicked{at}: {what}"));
        default(info);
    }));
}

fn write(text: &str) {
    let Some(path) = std::env::var_os(ENV) else {
        return;
    };
    if let Err(e) = std::fs::write(&path, cut(text, MAX_BYTES)) {
        tracing::warn!(error = %e, "could not write the termination message");
    }
}

/// `text` on one line, at most `max` bytes.
fn cut(text: &str, max: usize) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if line.len() <= max {
        return line;
    }
    let mut end = max;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_words_are_one_bounded_line_cut_on_a_character() {
        assert_eq!(
            cut("source loop:\nbroker said no", 100),
            "source loop: broker said no"
        );
        let long = "é".repeat(2000);
        let c = cut(&long, MAX_BYTES);
        assert!(
            c.len() <= MAX_BYTES && c.len() >= MAX_BYTES - 1,
            "{}",
            c.len()
        );
        assert!(c.chars().all(|ch| ch == 'é'));
    }
}
