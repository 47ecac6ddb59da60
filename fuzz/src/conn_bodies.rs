//! Fuzz target bodies over mirrorflow-conn: what a broker sends a connection. Shared by the
//! libFuzzer binaries (`fuzz_targets/`) and by `crates/conn/tests/fuzz_corpus.rs`, which runs
//! them over the seed corpus on stable.

use std::time::Duration;

use mirrorflow_conn::{Conn, ConnError, Options, Scram, ScramHash};

/// The client nonce of the SCRAM exchanges (RFC 7677's example), so that seeds can extend it.
pub const SCRAM_CLIENT_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";

/// First byte chooses where the broker's first SCRAM message ends; the rest is that message,
/// then the broker's final one. The client's answer to the first echoes the broker's nonce
/// (which must extend the client's) and nothing else of it: exactly its three attributes. The
/// final message is taken only when it carries the signature the client's proof expects, so
/// never without a first message taken before it.
pub fn scram_messages(data: &[u8]) {
    let (server_first, server_final) = match data.split_first() {
        Some((&at, rest)) => rest.split_at(usize::from(at).min(rest.len())),
        None => (&[][..], &[][..]),
    };
    let mut scram = Scram::new(
        ScramHash::Sha256,
        "user",
        "pencil",
        SCRAM_CLIENT_NONCE.to_owned(),
    );
    let client_final = scram.client_final(server_first);
    if let Ok(message) = &client_final {
        let attributes: Vec<&str> = message.split(',').collect();
        assert_eq!(attributes.len(), 3, "the broker's nonce added attributes");
        assert_eq!(attributes[0], "c=biws");
        let nonce = attributes[1]
            .strip_prefix("r=")
            .expect("the nonce comes second");
        assert!(nonce.starts_with(SCRAM_CLIENT_NONCE) && nonce.len() > SCRAM_CLIENT_NONCE.len());
        assert!(attributes[2].starts_with("p="), "the proof comes last");
    }
    let verified = scram.verify_server_final(server_final);
    if verified.is_ok() {
        assert!(
            client_final.is_ok(),
            "a final message taken without a proof sent"
        );
        assert!(
            !server_final.starts_with(b"e="),
            "a refusal taken as a signature"
        );
    }
    if let Err(e) = verified {
        assert!(matches!(e, ConnError::Authentication { .. }));
    }
}

/// The largest answer frame the `conn_frames` connection reads.
pub const CONN_FRAMES_MAX: usize = 1 << 16;

/// The input is what a broker sends on a connection: answer frames (size, correlation id,
/// body). The connection reads answers for requests 0, 1, 2, ... until one fails: every answer
/// read is its own frame's body, within the frame limit, and the answers read never take more
/// bytes than were sent.
pub fn conn_frames(data: &[u8]) {
    let options = Options {
        client_id: "fuzz".into(),
        timeout: Duration::from_secs(10),
        max_frame: CONN_FRAMES_MAX,
        address_check: None,
    };
    let mut conn = Conn::over("fuzz", std::io::Cursor::new(data.to_vec()), &options);
    let mut read = 0usize;
    for id in 0.. {
        match conn.recv(id) {
            Ok(body) => {
                assert!(
                    body.len() + 4 <= CONN_FRAMES_MAX,
                    "an answer past the frame limit"
                );
                read += body.len() + 8;
                assert!(read <= data.len(), "more answer bytes than were sent");
                let at = read - body.len();
                assert_eq!(
                    &data[at..read],
                    body.as_slice(),
                    "an answer is its frame's body"
                );
                assert_eq!(
                    data[at - 4..at],
                    id.to_be_bytes(),
                    "another request's answer"
                );
            }
            Err(ConnError::Io { .. } | ConnError::FrameSize { .. } | ConnError::Decode { .. }) => {
                break;
            }
            Err(other) => panic!("a frame error of another kind: {other}"),
        }
    }
}

/// The input is the offset partitions 0 to 3 of topic `t` are fetched from (8 bytes), then
/// the body of a Fetch answer, taken by a [`mirrorflow_conn::Fetcher`] as if its leader had
/// sent it. No position moves back; each batch handed on is one whole batch of the answer,
/// ends past where its partition was and not past where it is now, and is handed on once.
pub fn fetcher_answers(data: &[u8]) {
    use mirrorflow_conn::{Cluster, FetchLimits, Fetcher, Security};
    use mirrorflow_core::batch;
    let Some((offset, body)) = data.split_first_chunk::<8>() else {
        return;
    };
    let offset = i64::from_be_bytes(*offset);
    let options = Options {
        client_id: "fuzz".into(),
        timeout: Duration::from_secs(1),
        max_frame: CONN_FRAMES_MAX,
        address_check: None,
    };
    // Nothing is connected: the answer is handed in.
    let Ok(cluster) = Cluster::new("127.0.0.1:9", Security::default(), options) else {
        panic!("one bootstrap address is a cluster");
    };
    let limits = FetchLimits {
        max_bytes: 1 << 20,
        partition_max_bytes: 1 << 20,
        max_wait: Duration::from_millis(1),
    };
    let mut fetcher = Fetcher::new(cluster, limits);
    for partition in 0..4 {
        fetcher.assign("t", partition, offset);
    }
    let Ok(round) = fetcher.take_answer(1, body.to_vec()) else {
        return;
    };
    let mut last_end = [offset; 4];
    for fetched in &round.fetched {
        assert_eq!(&*fetched.topic, "t", "a topic not asked for");
        let p = usize::try_from(fetched.partition).expect("a partition asked for");
        let position = fetcher.position("t", fetched.partition).expect("assigned");
        assert!(
            fetched.next_offset <= position,
            "handed on past the position"
        );
        for range in &fetched.batches {
            assert!(range.end <= fetched.body.len(), "a range past the answer");
            let one: Vec<_> = batch::batches(&fetched.body[range.clone()]).collect();
            assert_eq!(one.len(), 1, "a range is one batch");
            let b = one[0].as_ref().expect("a handed-on batch parses");
            assert_eq!(b.bytes().len(), range.len(), "a range is a whole batch");
            assert!(
                b.header.next_offset() > last_end[p],
                "a batch handed on twice"
            );
            assert!(b.header.next_offset() <= fetched.next_offset);
            last_end[p] = b.header.next_offset();
        }
    }
    for partition in 0..4 {
        let position = fetcher.position("t", partition).expect("assigned");
        assert!(position >= offset, "a position moved back");
    }
}
