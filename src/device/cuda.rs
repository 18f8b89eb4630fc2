//! TEMPORARY stub (being replaced by the real cudarc backend).
use std::sync::Arc;
use crate::error::DeviceError;
use super::*;
pub struct CudaDevice;
impl CudaDevice {
    pub fn open(ordinal: i32) -> Result<Arc<CudaDevice>, DeviceError> {
        Err(DeviceError::NoDevice(format!("stub: no CUDA for ordinal {ordinal}")))
    }
}
pub fn cuda_available() -> bool { false }
impl Device for CudaDevice {
    fn backend(&self) -> Backend { Backend::Cuda }
    fn ordinal(&self) -> i32 { 0 }
    fn name(&self) -> String { String::new() }
    fn mem_info(&self) -> DeviceResult<(u64, u64)> { unimplemented!() }
    fn create_stream(&self) -> DeviceResult<RawStream> { unimplemented!() }
    fn destroy_stream(&self, _: RawStream) -> DeviceResult<()> { unimplemented!() }
    fn import_stream(&self, _: u64) -> DeviceResult<RawStream> { unimplemented!() }
    fn native_stream(&self, _: RawStream) -> u64 { unimplemented!() }
    fn synchronize_stream(&self, _: RawStream) -> DeviceResult<()> { unimplemented!() }
    fn enqueue_host(&self, _: RawStream, _: HostFn) -> DeviceResult<()> { unimplemented!() }
    fn alloc_async(&self, _: u64, _: RawStream) -> DeviceResult<DevicePtr> { unimplemented!() }
    fn free_async(&self, _: DevicePtr, _: RawStream) -> DeviceResult<()> { unimplemented!() }
    fn alloc_sync(&self, _: u64) -> DeviceResult<DevicePtr> { unimplemented!() }
    fn free_sync(&self, _: DevicePtr) -> DeviceResult<()> { unimplemented!() }
    fn create_event(&self) -> DeviceResult<RawEvent> { unimplemented!() }
    fn destroy_event(&self, _: RawEvent) {}
    fn record_event(&self, _: RawEvent, _: RawStream) -> DeviceResult<()> { unimplemented!() }
    fn stream_wait_event(&self, _: RawStream, _: RawEvent) -> DeviceResult<()> { unimplemented!() }
    fn event_query(&self, _: RawEvent) -> DeviceResult<bool> { unimplemented!() }
    fn event_synchronize(&self, _: RawEvent) -> DeviceResult<()> { unimplemented!() }
}
