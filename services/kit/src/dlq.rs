//! Dead letters: a record that cannot be processed is kept, with where it came from.
//!
//! The dead-letter record keeps the original key and payload byte for byte and adds
//! headers `sluice.dlq.topic`, `sluice.dlq.partition`, `sluice.dlq.offset`,
//! `sluice.dlq.error` (plus the original headers).

use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};

use crate::txn::Output;

pub const HEADER_TOPIC: &str = "sluice.dlq.topic";
pub const HEADER_PARTITION: &str = "sluice.dlq.partition";
pub const HEADER_OFFSET: &str = "sluice.dlq.offset";
pub const HEADER_ERROR: &str = "sluice.dlq.error";

/// A consumed record's headers, owned (a header without a value: empty bytes).
pub fn copy_headers(msg: &BorrowedMessage<'_>) -> Vec<(String, Vec<u8>)> {
    msg.headers()
        .map(|h| {
            h.iter()
                .map(|x| (x.key.to_owned(), x.value.unwrap_or_default().to_vec()))
                .collect()
        })
        .unwrap_or_default()
}

/// Headers to produce, from an [`Output`]'s pairs.
pub fn owned_headers(pairs: &[(String, Vec<u8>)]) -> OwnedHeaders {
    pairs
        .iter()
        .fold(OwnedHeaders::new_with_capacity(pairs.len()), |h, (k, v)| {
            h.insert(Header {
                key: k,
                value: Some(v),
            })
        })
}

/// The dead-letter record of a consumed Kafka record.
pub fn dead_letter(dlq_topic: &str, msg: &BorrowedMessage<'_>, error: &str) -> Output {
    let mut headers = copy_headers(msg);
    headers.extend(origin_headers(
        msg.topic(),
        msg.partition(),
        msg.offset(),
        error,
    ));
    Output {
        topic: dlq_topic.to_owned(),
        partition: None,
        key: msg.key().unwrap_or_default().to_vec(),
        payload: Some(msg.payload().unwrap_or_default().to_vec()),
        headers,
    }
}

fn origin_headers(topic: &str, partition: i32, offset: i64, error: &str) -> Vec<(String, Vec<u8>)> {
    vec![
        (HEADER_TOPIC.to_owned(), topic.as_bytes().to_vec()),
        (
            HEADER_PARTITION.to_owned(),
            partition.to_string().into_bytes(),
        ),
        (HEADER_OFFSET.to_owned(), offset.to_string().into_bytes()),
        (HEADER_ERROR.to_owned(), error.as_bytes().to_vec()),
    ]
}
