#![no_main]

libfuzzer_sys::fuzz_target!(init: sparsa::fuzzing::init(), |data: &[u8]| sparsa::fuzzing::shard_index(data));
