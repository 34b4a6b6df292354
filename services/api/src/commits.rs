//! An asset's recent commits from the evidence log (asset-events), newest first.
//! Every event of an asset is on one partition (keyed by the asset key), so the
//! read goes straight to it and scans back from its end in bounded steps.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sluice_core::{AssetEvent, AssetKey};
use sluice_kit::{BlockingCodec, SchemaName};

/// Records read per step back from the end.
const STEP: i64 = 5_000;
/// Records read at most per request: older commits are out of reach of this view.
const MAX_SCANNED: i64 = 50_000;

/// Why the evidence log could not be read (the API answers 503).
#[derive(Debug, thiserror::Error)]
pub enum CommitsError {
    #[error("{topic}/{partition}: {source}")]
    Kafka {
        topic: String,
        partition: i32,
        source: KafkaError,
    },
    #[error("reading {topic}/{partition} {start}..{end} timed out at {next}")]
    Timeout {
        topic: String,
        partition: i32,
        start: i64,
        end: i64,
        next: i64,
    },
}

pub struct Commits {
    pub config: ClientConfig,
    pub topic: String,
    pub partitions: i32,
    pub codec: BlockingCodec,
    pub timeout: Duration,
}

/// What a read found.
pub struct Found {
    pub events: Vec<AssetEvent>,
    /// Whether the scan reached the start of the partition (nothing older exists).
    pub complete: bool,
}

impl Commits {
    fn kafka(&self, partition: i32) -> impl FnOnce(KafkaError) -> CommitsError + '_ {
        move |source| CommitsError::Kafka {
            topic: self.topic.clone(),
            partition,
            source,
        }
    }

    /// The newest `limit` events of `asset` (a blocking read).
    pub fn newest(&self, asset: &AssetKey, limit: usize) -> Result<Found, CommitsError> {
        let partition =
            sluice_kit::kafka::partition_for(asset.as_str().as_bytes(), self.partitions);
        // The end of the partition is reported, so a read that ends on a
        // transaction marker (an offset no record has) still ends.
        let consumer = sluice_kit::kafka::reader(&self.config).map_err(self.kafka(partition))?;
        let (low, high) = consumer
            .fetch_watermarks(&self.topic, partition, self.timeout)
            .map_err(self.kafka(partition))?;
        let mut found: Vec<AssetEvent> = Vec::new();
        let mut end = high;
        while end > low && found.len() < limit && high - end < MAX_SCANNED {
            let start = (end - STEP).max(low);
            let mut step = self.read_range(&consumer, partition, start, end, asset)?;
            step.append(&mut found);
            found = step;
            end = start;
        }
        found.reverse();
        found.truncate(limit);
        Ok(Found {
            events: found,
            complete: end <= low,
        })
    }

    /// The events of `asset` at offsets `start..end`, oldest first.
    fn read_range(
        &self,
        consumer: &BaseConsumer<sluice_kit::kafka::ReaderContext>,
        partition: i32,
        start: i64,
        end: i64,
        asset: &AssetKey,
    ) -> Result<Vec<AssetEvent>, CommitsError> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.topic, partition, Offset::Offset(start))
            .map_err(self.kafka(partition))?;
        consumer.assign(&tpl).map_err(self.kafka(partition))?;
        let until = Instant::now() + self.timeout;
        let mut out = Vec::new();
        let mut next = start;
        while next < end {
            if Instant::now() > until {
                return Err(CommitsError::Timeout {
                    topic: self.topic.clone(),
                    partition,
                    start,
                    end,
                    next,
                });
            }
            match consumer.poll(Duration::from_millis(100)) {
                None => {}
                Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => return Err(self.kafka(partition)(e)),
                Some(Ok(msg)) => {
                    next = msg.offset() + 1;
                    if msg.offset() >= end || msg.key() != Some(asset.as_str().as_bytes()) {
                        continue;
                    }
                    // A record that does not decode was dead-lettered by the
                    // state-updater; it is not a commit of this asset.
                    if let Some(e) = msg.payload().and_then(|b| {
                        self.codec
                            .decode::<AssetEvent>(SchemaName::AssetEvent, b)
                            .ok()
                    }) {
                        out.push(e);
                    }
                }
            }
        }
        Ok(out)
    }
}
