//! The answers the project decodes, by the kind byte `fuzz/src/core_bodies.rs::broker_answers`
//! uses, decoded by the core's hand-written code and by kafka-protocol at the same versions.

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiVersionsResponse, FetchResponse, InitProducerIdResponse, ListOffsetsResponse,
    MetadataResponse, ProduceResponse, SaslAuthenticateResponse, SaslHandshakeResponse,
};
use kafka_protocol::protocol::Decodable;
use mirrorflow_core::protocol::{self, list_offsets, metadata};

/// The answer kinds of `broker_answers` (the kind byte `% 7`), with the versions both decode.
pub const KINDS: [(&str, i16); 7] = [
    ("Metadata", 8),
    ("ListOffsets", 4),
    ("Fetch", 11),
    ("Produce", 8),
    ("ApiVersions", 0),
    ("InitProducerId", 1),
    ("SaslHandshake+SaslAuthenticate", 1),
];

/// What a decoder made of one body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Decoded,
    Refused,
}

fn outcome<T, E>(r: Result<T, E>) -> Outcome {
    match r {
        Ok(_) => Outcome::Decoded,
        Err(_) => Outcome::Refused,
    }
}

pub fn project(kind: usize, body: &[u8]) -> Outcome {
    match kind % 7 {
        0 => outcome(metadata::decode_metadata(body)),
        1 => outcome(list_offsets::decode_list_offsets(body)),
        2 => outcome(protocol::decode_fetch(body)),
        3 => outcome(protocol::decode_produce(body)),
        4 => outcome(protocol::decode_api_versions(body)),
        5 => outcome(protocol::decode_init_producer_id(body)),
        _ => {
            let handshake = protocol::decode_sasl_handshake(body);
            let authenticate = protocol::decode_sasl_authenticate(body);
            outcome(handshake.and(authenticate))
        }
    }
}

/// kafka-protocol reads from `Bytes` (its strings and record bytes are slices of it).
pub fn library(kind: usize, body: &Bytes) -> Outcome {
    let mut b = body.clone();
    match kind % 7 {
        0 => outcome(MetadataResponse::decode(&mut b, 8)),
        1 => outcome(ListOffsetsResponse::decode(&mut b, 4)),
        2 => outcome(FetchResponse::decode(&mut b, 11)),
        3 => outcome(ProduceResponse::decode(&mut b, 8)),
        4 => outcome(ApiVersionsResponse::decode(&mut b, 0)),
        5 => outcome(InitProducerIdResponse::decode(&mut b, 1)),
        _ => {
            let handshake = SaslHandshakeResponse::decode(&mut b, 1);
            let authenticate = SaslAuthenticateResponse::decode(&mut body.clone(), 1);
            outcome(handshake.and(authenticate))
        }
    }
}

/// The library's error for a body it refuses ("" when it decodes it).
pub fn library_error(kind: usize, body: &Bytes) -> String {
    fn text<T>(r: anyhow::Result<T>) -> String {
        r.err().map(|e| format!("{e:#}")).unwrap_or_default()
    }
    let mut b = body.clone();
    match kind % 7 {
        0 => text(MetadataResponse::decode(&mut b, 8)),
        1 => text(ListOffsetsResponse::decode(&mut b, 4)),
        2 => text(FetchResponse::decode(&mut b, 11)),
        3 => text(ProduceResponse::decode(&mut b, 8)),
        4 => text(ApiVersionsResponse::decode(&mut b, 0)),
        5 => text(InitProducerIdResponse::decode(&mut b, 1)),
        _ => {
            let handshake = text(SaslHandshakeResponse::decode(&mut b, 1));
            let authenticate = text(SaslAuthenticateResponse::decode(&mut body.clone(), 1));
            format!("{handshake} {authenticate}")
        }
    }
}

/// The semantic checks the core's decoders make and kafka-protocol leaves to its caller: a
/// broker port outside TCP's, a listed offset below -1. Counted, not failed: a caller that
/// adopted the library would have to keep them.
pub fn library_accepts_what_the_core_refuses(kind: usize, body: &Bytes) -> bool {
    let mut b = body.clone();
    match kind % 7 {
        0 => MetadataResponse::decode(&mut b, 8)
            .map(|m| m.brokers.iter().any(|br| !(1..=65535).contains(&br.port)))
            .unwrap_or(false),
        1 => ListOffsetsResponse::decode(&mut b, 4)
            .map(|l| {
                l.topics
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .any(|p| p.offset < -1 || p.offset > mirrorflow_core::MAX_OFFSET)
            })
            .unwrap_or(false),
        _ => false,
    }
}
