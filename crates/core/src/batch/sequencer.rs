//! Idempotent writes of whole batches to one target partition: which sequence each batch
//! carries, which answer belongs to which batch, and what an error means for the batches
//! still unacknowledged.
//!
//! The target broker keeps, per producer and partition, the last sequences it wrote: it takes
//! a batch only when its base sequence follows the previous one, and answers a batch it already
//! has as a duplicate. So a batch that may not have been written is written again with the
//! same sequence, never a new one, and the batches after it follow it again, in order
//! ([`Answer::Resend`]). When the broker no longer knows the producer's sequences (its state
//! expired, or the log was truncated under it), no resend can be proven not to duplicate or
//! skip: the partition's unacknowledged batches are given back ([`Answer::Fault`]) to be copied
//! again from the last acknowledged position, under a new producer epoch.

use std::collections::VecDeque;

use super::{Stamp, next_sequence};
use crate::protocol::ErrorCode;

/// The most batches a partition may have unacknowledged: the brokers keep the last five
/// batches' sequences per producer and partition to recognise duplicates.
pub const MAX_IN_FLIGHT: usize = 5;

/// Which write of which batch an answer is for: the producer and base sequence the batch was
/// written with, and the partition's attempt when it was sent ([`Sequencer::attempt`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub attempt: u32,
}

/// What an answer means.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer<T> {
    /// The batch is written. `base_offset` is the target offset of its first record, or `None`
    /// when the broker had it already from an earlier write (its offset is not repeated).
    Written { token: T, base_offset: Option<i64> },
    /// The batch may not have been written (the leader moved, a timeout, too few replicas):
    /// every unacknowledged batch is to be sent again, in order, with the same sequences
    /// ([`Sequencer::resend`]).
    Resend(ErrorCode),
    /// The partition's writes failed for good: the tokens of every unacknowledged batch, oldest
    /// first. The sequencer is empty; the next batch needs a new producer epoch
    /// ([`Sequencer::new`]).
    Fault { error: ErrorCode, tokens: Vec<T> },
    /// An answer to a write that was superseded (sent again, or given back in a fault).
    Stale,
}

#[derive(Debug)]
struct InFlight<T> {
    base_sequence: i32,
    token: T,
}

/// One target partition's unacknowledged batches under one producer id and epoch.
#[derive(Debug)]
pub struct Sequencer<T> {
    producer_id: i64,
    producer_epoch: i16,
    next: i32,
    attempt: u32,
    in_flight: VecDeque<InFlight<T>>,
    /// Whether the broker acknowledged a batch of this producer on the partition.
    acknowledged: bool,
}

impl<T> Sequencer<T> {
    /// A producer id and epoch fresh from InitProducerId: sequences start at 0.
    pub fn new(producer_id: i64, producer_epoch: i16) -> Self {
        Self {
            producer_id,
            producer_epoch,
            next: 0,
            attempt: 0,
            in_flight: VecDeque::new(),
            acknowledged: false,
        }
    }

    /// Whether another batch may be sent ([`MAX_IN_FLIGHT`]).
    pub fn has_room(&self) -> bool {
        self.in_flight.len() < MAX_IN_FLIGHT
    }

    /// Whether the next batch may be sent now. Until the broker has acknowledged one batch of
    /// the producer on the partition it keeps no sequence of it there, and it takes a batch of
    /// any sequence: a later batch could be written before an earlier one that failed (a
    /// leader not yet elected on a new topic), and that earlier one then be refused as out of
    /// order. So the first batch goes alone; after it, up to [`MAX_IN_FLIGHT`].
    pub fn may_send(&self) -> bool {
        self.has_room() && (self.acknowledged || self.in_flight.is_empty())
    }

    pub fn unacknowledged(&self) -> usize {
        self.in_flight.len()
    }

    /// The current attempt: it changes when the unacknowledged batches are sent again, so
    /// answers to the earlier writes are recognised as stale.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Gives the next batch of `records` records its sequence: the stamp to write it with and
    /// the ticket its answer is matched by. `None` when [`Self::has_room`] is false.
    pub fn assign(&mut self, records: i32, token: T) -> Option<(Stamp, Ticket)> {
        if !self.has_room() {
            return None;
        }
        let base_sequence = self.next;
        self.next = next_sequence(base_sequence, records);
        self.in_flight.push_back(InFlight {
            base_sequence,
            token,
        });
        Some((self.stamp(base_sequence), self.ticket(base_sequence)))
    }

    fn stamp(&self, base_sequence: i32) -> Stamp {
        Stamp {
            producer_id: self.producer_id,
            producer_epoch: self.producer_epoch,
            base_sequence,
            transactional: false,
        }
    }

    fn ticket(&self, base_sequence: i32) -> Ticket {
        Ticket {
            producer_id: self.producer_id,
            producer_epoch: self.producer_epoch,
            base_sequence,
            attempt: self.attempt,
        }
    }

    /// Starts a new attempt and gives every unacknowledged batch's stamp, ticket and token,
    /// oldest first, to be written again in that order.
    pub fn resend(&mut self) -> Vec<(Stamp, Ticket, &T)> {
        self.attempt = self.attempt.wrapping_add(1);
        let (id, epoch, attempt) = (self.producer_id, self.producer_epoch, self.attempt);
        self.in_flight
            .iter()
            .map(|b| {
                let stamp = Stamp {
                    producer_id: id,
                    producer_epoch: epoch,
                    base_sequence: b.base_sequence,
                    transactional: false,
                };
                let ticket = Ticket {
                    producer_id: id,
                    producer_epoch: epoch,
                    base_sequence: b.base_sequence,
                    attempt,
                };
                (stamp, ticket, &b.token)
            })
            .collect()
    }

    /// The broker's answer for the write `ticket` (its partition's error and base offset).
    pub fn answer(&mut self, ticket: Ticket, error: ErrorCode, base_offset: i64) -> Answer<T> {
        let producer = (ticket.producer_id, ticket.producer_epoch);
        if ticket.attempt != self.attempt || producer != (self.producer_id, self.producer_epoch) {
            return Answer::Stale;
        }
        let Some(at) = self
            .in_flight
            .iter()
            .position(|b| b.base_sequence == ticket.base_sequence)
        else {
            return Answer::Stale;
        };
        let written = match error {
            ErrorCode::NONE => Some(Some(base_offset).filter(|&o| o >= 0)),
            ErrorCode::DUPLICATE_SEQUENCE_NUMBER => Some(None),
            _ => None,
        };
        match written {
            // Answers come in the order of the writes: the oldest batch is answered first.
            Some(base_offset) if at == 0 => match self.in_flight.pop_front() {
                Some(b) => {
                    self.acknowledged = true;
                    Answer::Written {
                        token: b.token,
                        base_offset,
                    }
                }
                None => Answer::Stale,
            },
            // A later batch written before an earlier one was answered: the broker would not
            // have taken it out of order, so the answers are not this partition's writes.
            Some(_) => self.fault(ErrorCode::OUT_OF_ORDER_SEQUENCE_NUMBER),
            None if error.is_retriable() => Answer::Resend(error),
            // An earlier batch of this attempt failed first; its resend covers this one.
            None if error == ErrorCode::OUT_OF_ORDER_SEQUENCE_NUMBER && at > 0 => {
                Answer::Resend(error)
            }
            None => self.fault(error),
        }
    }

    /// Gives every unacknowledged batch back, as a fault the writer found itself (a batch
    /// that could not be written at all): always [`Answer::Fault`].
    pub fn abandon(&mut self, error: ErrorCode) -> Answer<T> {
        self.fault(error)
    }

    fn fault(&mut self, error: ErrorCode) -> Answer<T> {
        self.attempt = self.attempt.wrapping_add(1);
        let tokens = self.in_flight.drain(..).map(|b| b.token).collect();
        Answer::Fault { error, tokens }
    }
}

#[cfg(test)]
mod tests;
