//! The device's memory: how many bytes kvrun may allocate on the adapter, read once when it is
//! opened. wgpu reports no memory size, so this reads it below wgpu, through its Vulkan HAL:
//! `VK_EXT_memory_budget`'s budget of the largest device-local heap (the driver's estimate of
//! what this process may use of it, its own allocations included), else that heap's size. A
//! CPU adapter's memory is host RAM whatever heap it reports, so there the budget is what the
//! host has available (`MemAvailable` on Linux). Metal's `recommendedMaxWorkingSetSize` and
//! DXGI's `QueryVideoMemoryInfo` are not read yet: those backends report no budget.

/// Where [`DeviceMemory::budget_bytes`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySource {
    /// Vulkan `VK_EXT_memory_budget`: the heap's budget for this process.
    VulkanMemoryBudget,
    /// Vulkan without the extension: the heap's size.
    VulkanHeapSize,
    /// A CPU adapter: the host's available memory.
    HostAvailable,
    /// The backend gives no size (Metal, DX12 for now).
    Unknown,
    /// Given by the user (`--device-memory`).
    Given,
}

/// The adapter's memory as kvrun sizes allocations against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceMemory {
    /// Bytes kvrun may allocate; `None` where the backend does not say.
    pub budget_bytes: Option<u64>,
    /// The largest device-local heap's size (Vulkan), for reference.
    pub heap_bytes: Option<u64>,
    pub source: MemorySource,
}

impl DeviceMemory {
    pub const UNKNOWN: DeviceMemory =
        DeviceMemory { budget_bytes: None, heap_bytes: None, source: MemorySource::Unknown };

    /// `bytes` as the budget (`--device-memory`), the heap read for reference.
    pub fn given(adapter: &wgpu::Adapter, bytes: u64) -> DeviceMemory {
        let heap_bytes = vulkan(adapter).and_then(|m| m.heap_bytes);
        DeviceMemory { budget_bytes: Some(bytes), heap_bytes, source: MemorySource::Given }
    }

    /// Reads the adapter's memory. A CPU adapter allocates host memory whatever heap it reports
    /// (lavapipe says 2 GiB and allocates past it), so `is_cpu` takes the host's available
    /// memory instead where it is known.
    pub fn read(adapter: &wgpu::Adapter, is_cpu: bool) -> DeviceMemory {
        let memory = vulkan(adapter).unwrap_or(DeviceMemory::UNKNOWN);
        match (is_cpu, host_available_bytes()) {
            (true, Some(host)) => DeviceMemory {
                budget_bytes: Some(host),
                source: MemorySource::HostAvailable,
                ..memory
            },
            _ => memory,
        }
    }
}

/// Vulkan: the largest device-local heap's budget (or size). (wgpu-hal builds its Vulkan
/// backend where the platform has Vulkan: not on Apple targets without portability.)
#[cfg(not(any(target_arch = "wasm32", target_vendor = "apple")))]
#[allow(unsafe_code)]
fn vulkan(adapter: &wgpu::Adapter) -> Option<DeviceMemory> {
    use ash::vk;
    // SAFETY: the HAL adapter is only read (properties of its physical device) while the guard
    // lives, and the instance it came from outlives it.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let instance = hal.shared_instance().raw_instance();
    let physical = hal.raw_physical_device();
    let caps = hal.physical_device_capabilities();
    // vkGetPhysicalDeviceMemoryProperties2 is core from Vulkan 1.1, for instance and device
    let v11 = hal.shared_instance().instance_api_version() >= vk::API_VERSION_1_1
        && caps.properties().api_version >= vk::API_VERSION_1_1;
    let with_budget = v11 && caps.supports_extension(ash::ext::memory_budget::NAME);
    let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
    let props = if with_budget {
        let mut props2 = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
        // SAFETY: a valid physical device of this instance; the chain's structs live here
        unsafe { instance.get_physical_device_memory_properties2(physical, &mut props2) };
        props2.memory_properties
    } else {
        // SAFETY: as above
        unsafe { instance.get_physical_device_memory_properties(physical) }
    };
    let count = (props.memory_heap_count as usize).min(props.memory_heaps.len());
    let (index, heap) = props.memory_heaps[..count]
        .iter()
        .enumerate()
        .filter(|(_, h)| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
        .max_by_key(|(_, h)| h.size)?;
    let (budget_bytes, source) = match with_budget && budget.heap_budget[index] > 0 {
        true => (budget.heap_budget[index].min(heap.size), MemorySource::VulkanMemoryBudget),
        false => (heap.size, MemorySource::VulkanHeapSize),
    };
    Some(DeviceMemory { budget_bytes: Some(budget_bytes), heap_bytes: Some(heap.size), source })
}

#[cfg(any(target_arch = "wasm32", target_vendor = "apple"))]
fn vulkan(_: &wgpu::Adapter) -> Option<DeviceMemory> {
    None
}

/// The host's available memory (`MemAvailable` of /proc/meminfo); `None` elsewhere.
pub fn host_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
