fn main() {
    // Only the Node build needs the napi link arguments; the pure core builds without them.
    #[cfg(feature = "node")]
    napi_build::setup();
}
