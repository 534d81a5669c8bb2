//! Streams and events.

use std::ffi::{c_int, c_uint};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::put;
use crate::abi::{self, CuResult};
use crate::emulator;
use crate::streams::{self, Event, Stream};

// ---- streams ----

fn stream_create(out: *mut u64, flags: c_uint) -> Result<(), CuResult> {
    let e = emulator();
    let ctx = e.current()?;
    if out.is_null() || flags & !abi::STREAM_NON_BLOCKING != 0 {
        return Err(abi::INVALID_VALUE);
    }
    let stream = Stream::new(ctx.device, flags, false, |id| format!("stream {id:#x}"));
    e.streams.lock().insert(stream.id, Arc::clone(&stream));
    ctx.streams.lock().push(Arc::clone(&stream));
    // SAFETY: out-parameter, checked non-null.
    unsafe { put(out, stream.id) }
}

driver_fn!(
    fn cuStreamCreate(out: *mut u64, flags: c_uint) {
        stream_create(out, flags)
    }
);
driver_fn!(
    fn cuStreamCreateWithPriority(out: *mut u64, flags: c_uint, _priority: c_int) {
        stream_create(out, flags)
    }
);

driver_fn!(
    fn cuStreamDestroy_v2(handle: u64) {
        let e = emulator();
        e.ready()?;
        let stream = e.streams.lock().remove(&handle).ok_or(abi::INVALID_HANDLE)?;
        e.contexts[stream.device as usize].streams.lock().retain(|s| !Arc::ptr_eq(s, &stream));
        // Queued work still runs; the worker ends after it, as the driver lets it.
        stream.destroy();
        Ok(())
    }
);

driver_fn!(
    fn cuStreamSynchronize(handle: u64) {
        let e = emulator();
        let stream = e.stream(handle)?;
        if stream.legacy {
            // The legacy stream's work waits for every blocking stream: so does a sync of it.
            let ctx = &e.contexts[stream.device as usize];
            for s in ctx.all_streams().iter().filter(|s| s.blocking) {
                e.host_waits(s)?;
            }
        }
        e.host_waits(&stream)
    }
);

driver_fn!(
    fn cuStreamQuery(handle: u64) {
        let e = emulator();
        let stream = e.stream(handle)?;
        e.contexts[stream.device as usize].sticky_error()?;
        if stream.is_idle() {
            e.races.host_learns(&stream.snapshot().1);
            Ok(())
        } else {
            Err(abi::NOT_READY)
        }
    }
);

driver_fn!(
    fn cuStreamWaitEvent(handle: u64, event: u64, _flags: c_uint) {
        let e = emulator();
        let stream = e.stream(handle)?;
        let event = e.event(event)?;
        if let Some(r) = event.recorded() {
            crate::streams::enqueue(e, &stream, vec![(r.stream, r.upto, r.clock)], None, &[]);
        }
        Ok(())
    }
);

driver_fn!(
    fn cuStreamGetFlags(handle: u64, flags: *mut c_uint) {
        let stream = emulator().stream(handle)?;
        // SAFETY: out-parameter.
        unsafe { put(flags, stream.flags) }
    }
);

driver_fn!(
    fn cuStreamGetPriority(handle: u64, priority: *mut c_int) {
        emulator().stream(handle)?;
        // SAFETY: out-parameter.
        unsafe { put(priority, 0) }
    }
);

driver_fn!(
    fn cuStreamGetCtx(handle: u64, ctx: *mut u64) {
        let e = emulator();
        let stream = e.stream(handle)?;
        // SAFETY: out-parameter.
        unsafe { put(ctx, e.context_handle(stream.device)) }
    }
);

driver_fn!(
    fn cuStreamGetId(handle: u64, id: *mut u64) {
        let stream = emulator().stream(handle)?;
        // SAFETY: out-parameter.
        unsafe { put(id, stream.id) }
    }
);

driver_fn!(
    fn cuStreamGetDevice(handle: u64, device: *mut c_int) {
        let stream = emulator().stream(handle)?;
        // SAFETY: out-parameter.
        unsafe { put(device, stream.device) }
    }
);

// ---- events ----

driver_fn!(
    fn cuEventCreate(out: *mut u64, _flags: c_uint) {
        let e = emulator();
        e.current()?;
        if out.is_null() {
            return Err(abi::INVALID_VALUE);
        }
        let id = e.next_event.fetch_add(0x10, Relaxed);
        e.events.lock().insert(id, Arc::new(Event::default()));
        // SAFETY: out-parameter, checked non-null.
        unsafe { put(out, id) }
    }
);

fn event_record(event: u64, stream: u64) -> Result<(), CuResult> {
    let e = emulator();
    let event = e.event(event)?;
    let stream = e.stream(stream)?;
    // A record is work on the stream too: on the legacy default stream, its event stands for the
    // blocking streams' work before it (on a blocking stream, for the legacy stream's), as in CUDA.
    let waits = e.contexts[stream.device as usize].implicit_waits(&stream);
    streams::enqueue(e, &stream, waits, None, &[]);
    event.record(&stream);
    Ok(())
}

driver_fn!(
    fn cuEventRecord(event: u64, stream: u64) {
        event_record(event, stream)
    }
);
driver_fn!(
    fn cuEventRecordWithFlags(event: u64, stream: u64, _flags: c_uint) {
        event_record(event, stream)
    }
);

driver_fn!(
    fn cuEventQuery(event: u64) {
        let e = emulator();
        let Some(r) = e.event(event)?.recorded() else { return Ok(()) };
        e.contexts[r.stream.device as usize].sticky_error()?;
        if r.stream.done_upto(r.upto) {
            e.races.host_learns(&r.clock);
            Ok(())
        } else {
            Err(abi::NOT_READY)
        }
    }
);

driver_fn!(
    fn cuEventSynchronize(event: u64) {
        let e = emulator();
        let Some(r) = e.event(event)?.recorded() else { return Ok(()) };
        r.stream.wait_for(r.upto);
        e.races.host_learns(&r.clock);
        e.contexts[r.stream.device as usize].sticky_error()
    }
);

driver_fn!(
    fn cuEventDestroy_v2(event: u64) {
        let e = emulator();
        e.ready()?;
        e.events.lock().remove(&event).map(|_| ()).ok_or(abi::INVALID_HANDLE)
    }
);
