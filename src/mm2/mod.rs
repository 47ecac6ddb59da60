//! MirrorMaker 2 compatibility core (filled in by the replication-core work).
