#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sparsa::fuzzing::chat_template(data));
