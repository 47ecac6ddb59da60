/// librdkafka's symbols the binary is linked with `--wrap=` for (lz4, zstd and snappy
/// inflaters); read by this crate and by both build scripts that pass the flags.
pub const WRAPPED: [&str; 4] = [
    "rd_kafka_lz4_decompress",
    "rd_kafka_zstd_decompress",
    "rd_kafka_snappy_java_uncompress",
    "rd_kafka_snappy_uncompressed_length",
];
