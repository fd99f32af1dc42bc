/*
 * backends/vulkan/vk-device.c — the Vulkan instance, the physical devices (vulkan:N is the
 * Nth that vkEnumeratePhysicalDevices returns), opening and closing one, what it can do
 * (caps, supports), and how Vulkan's results become kiln errors.
 *
 * Requirements. The kernels index with int64 in places and keep u8/bool in 8-bit storage,
 * so a device needs Vulkan 1.2, shaderInt64, storageBuffer8BitAccess, timeline semaphores
 * and VK_KHR_push_descriptor; one without them is refused at open, naming what it lacks.
 * f16 and bf16 need 16-bit storage (and shaderFloat16 for f16), f64 needs shaderFloat64;
 * without them those dtypes are left out of caps, so the engine refuses them by name.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk-impl.h"

const char *kvk_result_name(VkResult r)
{
    switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_FORMAT_NOT_SUPPORTED: return "VK_ERROR_FORMAT_NOT_SUPPORTED";
    case VK_ERROR_FRAGMENTED_POOL: return "VK_ERROR_FRAGMENTED_POOL";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    case VK_ERROR_INVALID_SHADER_NV: return "VK_ERROR_INVALID_SHADER_NV";
    default: return "VkResult (unnamed)";
    }
}

int kvk_vk_error(kvk_device *d, const char *op, const char *what, VkResult r)
{
    /* the device's name in every message: a program with several devices (a kilnd serving
     * on cpu and vulkan:0) must be told which one ran out or failed */
    char dev[VK_MAX_PHYSICAL_DEVICE_NAME_SIZE + 32] = "vulkan";
    if (d)
        snprintf(dev, sizeof dev, "vulkan:%d (%s)", d->index, d->name);
    if (r == VK_ERROR_DEVICE_LOST) {
        if (d)
            atomic_store(&d->lost, true);
        return kiln__error_set_code(KILN_EDEVICE, "%s: the vulkan device %s was lost (%s: VK_ERROR_DEVICE_LOST)",
                                    op, dev, what);
    }
    if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY) {
        return kiln__error_set_code(KILN_ENOMEM, "%s: %s is out of %s memory (%s: %s)", op, dev,
                                    r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? "device" : "host", what,
                                    kvk_result_name(r));
    }
    return kiln__error_set_code(KILN_EDEVICE, "%s: %s failed on %s (%s, %d)", op, what, dev, kvk_result_name(r),
                                (int)r);
}

int kvk_loop_check(kvk_queue *q, const char *op, int64_t steps, const char *fmt, ...)
{
    uint32_t limit = q->d->feat.loop_limit;
    /* steps is an estimate: a sixteenth of the limit to spare */
    if (limit == 0 || steps < (int64_t)limit - limit / 16)
        return 0;
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    kiln__error_set("%s: %s takes one shader invocation about %lld loop iterations, and '%s' (%s) stops "
                    "every shader loop after %u with the values wrong; refused (GPU drivers have no such limit)",
                    op, what, (long long)steps, q->d->name, q->d->driver, limit);
    return KILN_ENOTSUP;
}

int kvk_memory_type(kvk_device *d, uint32_t bits, VkMemoryPropertyFlags want)
{
    for (uint32_t i = 0; i < d->memprops.memoryTypeCount; i++)
        if ((bits & (1u << i)) && (d->memprops.memoryTypes[i].propertyFlags & want) == want)
            return (int)i;
    return -1;
}

/* ------------------------------------------------------------------ instance */

/* One VkInstance for the process, made on first use and kept: creating one loads the
 * driver (tens of milliseconds, and lavapipe's one-time initialisation keeps memory that
 * unloading the driver would orphan on every open/close cycle). The lock guards its
 * creation; a failed attempt is retried by the next open (the driver may appear). */
static pthread_mutex_t instance_lock = PTHREAD_MUTEX_INITIALIZER;
static VkInstance shared_instance;

static VkResult make_instance(VkInstance *out)
{
    VkApplicationInfo app = {
        .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
        .pApplicationName = "kiln",
        .pEngineName = "kiln",
        .apiVersion = VK_API_VERSION_1_2,
    };
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    return vkCreateInstance(&ci, NULL, out);
}

static VkResult get_instance(VkInstance *out)
{
    pthread_mutex_lock(&instance_lock);
    VkResult r = VK_SUCCESS;
    if (!shared_instance)
        r = make_instance(&shared_instance);
    if (r != VK_SUCCESS)
        shared_instance = VK_NULL_HANDLE;
    *out = shared_instance;
    pthread_mutex_unlock(&instance_lock);
    return r;
}

/* The physical devices in the loader's order; *n their count. NULL + message on failure. */
static VkPhysicalDevice *list_physical(VkInstance inst, uint32_t *n, const char *op)
{
    VkResult r = vkEnumeratePhysicalDevices(inst, n, NULL);
    if (r != VK_SUCCESS) {
        kvk_vk_error(NULL, op, "vkEnumeratePhysicalDevices", r);
        return NULL;
    }
    VkPhysicalDevice *p = calloc(*n ? *n : 1, sizeof *p);
    if (!p) {
        kiln__error_set("%s: out of memory", op);
        return NULL;
    }
    r = vkEnumeratePhysicalDevices(inst, n, p);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) {
        free(p);
        kvk_vk_error(NULL, op, "vkEnumeratePhysicalDevices", r);
        return NULL;
    }
    return p;
}

/* An instance and the physical device `index`; 0 or a KILN_E* code with the message. */
static int find_physical(int index, VkInstance *inst, VkPhysicalDevice *phys, const char *op)
{
    VkResult r = get_instance(inst);
    if (r != VK_SUCCESS) {
        *inst = VK_NULL_HANDLE;
        if (r == VK_ERROR_INCOMPATIBLE_DRIVER || r == VK_ERROR_INITIALIZATION_FAILED)
            return kiln__error_set_code(
                KILN_EDEVICE,
                "%s: no Vulkan driver (vkCreateInstance: %s); install one (mesa-vulkan-drivers "
                "provides lavapipe) or check VK_ICD_FILENAMES",
                op, kvk_result_name(r));
        return kvk_vk_error(NULL, op, "vkCreateInstance", r);
    }
    uint32_t n = 0;
    VkPhysicalDevice *all = list_physical(*inst, &n, op);
    if (!all) {
        *inst = VK_NULL_HANDLE;
        return KILN_EDEVICE;
    }
    if (index < 0 || (uint32_t)index >= n) {
        free(all);
        *inst = VK_NULL_HANDLE;
        if (n == 0)
            return kiln__error_set_code(KILN_EDEVICE, "%s: no Vulkan device found (the loader lists none)", op);
        return kiln__error_set("%s: no device %d (there %s %u: vulkan:0%s)", op, index, n == 1 ? "is" : "are", n,
                               n == 1 ? "" : " ..."),
               KILN_EINVAL;
    }
    *phys = all[index];
    free(all);
    return 0;
}

static bool has_extension(VkPhysicalDevice phys, const char *name)
{
    uint32_t n = 0;
    if (vkEnumerateDeviceExtensionProperties(phys, NULL, &n, NULL) != VK_SUCCESS)
        return false;
    VkExtensionProperties *e = calloc(n ? n : 1, sizeof *e);
    if (!e)
        return false;
    bool found = false;
    if (vkEnumerateDeviceExtensionProperties(phys, NULL, &n, e) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++)
            found = strcmp(e[i].extensionName, name) == 0;
    free(e);
    return found;
}

/* The driver's name and version text for device lists and messages. */
static void describe_driver(VkPhysicalDevice phys, char *out, size_t len)
{
    VkPhysicalDeviceDriverProperties drv = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &drv};
    vkGetPhysicalDeviceProperties2(phys, &p2);
    snprintf(out, len, "%s%s%s", drv.driverName, drv.driverInfo[0] ? " " : "", drv.driverInfo);
}

static VkDeviceSize device_local_bytes(const VkPhysicalDeviceMemoryProperties *m)
{
    VkDeviceSize best = 0;
    for (uint32_t i = 0; i < m->memoryHeapCount; i++)
        if ((m->memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && m->memoryHeaps[i].size > best)
            best = m->memoryHeaps[i].size;
    return best;
}

/* ------------------------------------------------------------------ open / close */

static void destroy(kvk_device *d)
{
    if (d->dev) {
        vkDeviceWaitIdle(d->dev);
        kvk_pipelines_destroy(d);
        kvk_alloc_destroy(d);
        if (d->pipe_layout)
            vkDestroyPipelineLayout(d->dev, d->pipe_layout, NULL);
        if (d->set_layout)
            vkDestroyDescriptorSetLayout(d->dev, d->set_layout, NULL);
        vkDestroyDevice(d->dev, NULL);
    }
    pthread_mutex_destroy(&d->submit_lock);
    pthread_mutex_destroy(&d->pipe_lock);
    pthread_mutex_destroy(&d->queues_lock);
    pthread_mutex_destroy(&d->alloc.lock);
    free(d);
}

static int create_layouts(kvk_device *d)
{
    VkDescriptorSetLayoutBinding b[KVK_MAX_BUFS + 1];
    for (int i = 0; i <= KVK_MAX_BUFS; i++)
        b[i] = (VkDescriptorSetLayoutBinding){
            .binding = (uint32_t)i,
            .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            .descriptorCount = 1,
            .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT,
        };
    VkDescriptorSetLayoutCreateInfo sci = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
        .flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR,
        .bindingCount = KVK_MAX_BUFS + 1,
        .pBindings = b,
    };
    VkResult r = vkCreateDescriptorSetLayout(d->dev, &sci, NULL, &d->set_layout);
    if (r != VK_SUCCESS)
        return kvk_vk_error(d, "vulkan", "vkCreateDescriptorSetLayout", r);
    VkPipelineLayoutCreateInfo pci = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
        .setLayoutCount = 1,
        .pSetLayouts = &d->set_layout,
    };
    r = vkCreatePipelineLayout(d->dev, &pci, NULL, &d->pipe_layout);
    if (r != VK_SUCCESS)
        return kvk_vk_error(d, "vulkan", "vkCreatePipelineLayout", r);
    return 0;
}

void *kvk_open(int index)
{
    char op[32];
    snprintf(op, sizeof op, "vulkan:%d", index);
    kvk_device *d = calloc(1, sizeof *d);
    if (!d) {
        kiln__error_set("%s: out of memory opening the device", op);
        return NULL;
    }
    d->index = index;
    pthread_mutex_init(&d->submit_lock, NULL);
    pthread_mutex_init(&d->pipe_lock, NULL);
    pthread_mutex_init(&d->queues_lock, NULL);
    kvk_alloc_init(&d->alloc);
    atomic_init(&d->lost, false);
    if (find_physical(index, &d->instance, &d->phys, op) < 0) {
        destroy(d);
        return NULL;
    }
    vkGetPhysicalDeviceProperties(d->phys, &d->props);
    vkGetPhysicalDeviceMemoryProperties(d->phys, &d->memprops);
    snprintf(d->name, sizeof d->name, "%s", d->props.deviceName);
    describe_driver(d->phys, d->driver, sizeof d->driver);

    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceVulkan11Features f11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                            .pNext = &f12};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f11};
    vkGetPhysicalDeviceFeatures2(d->phys, &f2);
    const char *lacks = NULL;
    if (d->props.apiVersion < VK_API_VERSION_1_2)
        lacks = "Vulkan 1.2";
    else if (!f2.features.shaderInt64)
        lacks = "shaderInt64";
    else if (!f12.storageBuffer8BitAccess)
        lacks = "storageBuffer8BitAccess";
    else if (!f12.timelineSemaphore)
        lacks = "timeline semaphores";
    else if (!has_extension(d->phys, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME))
        lacks = VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME;
    if (lacks) {
        kiln__error_set("%s: device '%s' (%s) lacks %s, which the vulkan backend needs", op, d->name, d->driver,
                        lacks);
        destroy(d);
        return NULL;
    }
    d->feat.f16 = f11.storageBuffer16BitAccess && f12.shaderFloat16;
    d->feat.f64 = f2.features.shaderFloat64;
    d->feat.max_range = d->props.limits.maxStorageBufferRange;
    d->feat.align = d->props.limits.minStorageBufferOffsetAlignment;
    if (d->feat.align < 64)
        d->feat.align = 64;
    d->feat.max_wg_invocations = d->props.limits.maxComputeWorkGroupInvocations;
    d->feat.device_memory = device_local_bytes(&d->memprops);
    VkPhysicalDeviceDriverProperties drv = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
    VkPhysicalDeviceProperties2 dp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &drv};
    vkGetPhysicalDeviceProperties2(d->phys, &dp);
    /* gallivm's loop limiter: one counter per shader invocation, decremented at the end of
     * every loop iteration, ends all loops once it reaches 0 (LP_MAX_TGSI_LOOP_ITERATIONS) */
    d->feat.loop_limit = drv.driverID == VK_DRIVER_ID_MESA_LLVMPIPE ? 65535u : 0u;
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    vkGetPhysicalDeviceProperties2(d->phys, &p2);
    d->feat.subgroup_size = sg.subgroupSize;
    d->feat.subgroup_arith = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                             (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT);

    for (int t = 0; t < KILN_DTYPE_COUNT; t++)
        d->dtype_ok[t] = true;
    d->dtype_ok[KILN_F16] = d->feat.f16;
    d->dtype_ok[KILN_BF16] = f11.storageBuffer16BitAccess;
    d->dtype_ok[KILN_F64] = d->feat.f64;

    /* a compute queue family */
    uint32_t nfam = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(d->phys, &nfam, NULL);
    VkQueueFamilyProperties fam[16];
    if (nfam > 16)
        nfam = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(d->phys, &nfam, fam);
    d->family = UINT32_MAX;
    for (uint32_t i = 0; i < nfam; i++)
        if (fam[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            d->family = i;
            break;
        }
    if (d->family == UINT32_MAX) {
        kiln__error_set("%s: device '%s' has no compute queue", op, d->name);
        destroy(d);
        return NULL;
    }

    VkPhysicalDeviceVulkan12Features e12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
        .storageBuffer8BitAccess = VK_TRUE,
        .uniformAndStorageBuffer8BitAccess = f12.uniformAndStorageBuffer8BitAccess,
        .shaderInt8 = f12.shaderInt8,
        .shaderFloat16 = f12.shaderFloat16,
        .timelineSemaphore = VK_TRUE,
    };
    VkPhysicalDeviceVulkan11Features e11 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
        .pNext = &e12,
        .storageBuffer16BitAccess = f11.storageBuffer16BitAccess,
        .uniformAndStorageBuffer16BitAccess = f11.uniformAndStorageBuffer16BitAccess,
    };
    VkPhysicalDeviceFeatures2 e2 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
        .pNext = &e11,
        .features = {.shaderInt64 = VK_TRUE,
                     .shaderFloat64 = f2.features.shaderFloat64,
                     .shaderInt16 = f2.features.shaderInt16},
    };
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
        .queueFamilyIndex = d->family,
        .queueCount = 1,
        .pQueuePriorities = &prio,
    };
    const char *exts[] = {VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME};
    VkDeviceCreateInfo dci = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
        .pNext = &e2,
        .queueCreateInfoCount = 1,
        .pQueueCreateInfos = &qci,
        .enabledExtensionCount = 1,
        .ppEnabledExtensionNames = exts,
    };
    VkResult r = vkCreateDevice(d->phys, &dci, NULL, &d->dev);
    if (r != VK_SUCCESS) {
        d->dev = VK_NULL_HANDLE;
        kvk_vk_error(d, op, "vkCreateDevice", r);
        destroy(d);
        return NULL;
    }
    vkGetDeviceQueue(d->dev, d->family, 0, &d->vkq);
    d->push_descriptors = (PFN_vkCmdPushDescriptorSetKHR)vkGetDeviceProcAddr(d->dev, "vkCmdPushDescriptorSetKHR");
    if (!d->push_descriptors) {
        kiln__error_set("%s: vkCmdPushDescriptorSetKHR is missing from the driver", op);
        destroy(d);
        return NULL;
    }
    if (create_layouts(d) < 0 || kvk_pipelines_init(d) < 0) {
        destroy(d);
        return NULL;
    }
    d->dummy = kvk_buffer_alloc_device(d, 64, op);
    if (!d->dummy) {
        destroy(d);
        return NULL;
    }
    return d;
}

void *kvk_open_opts(const char *spec, int index, kiln_device_opts *o)
{
    (void)spec;
    (void)o;
    return kvk_open(index);
}

void kvk_close(void *ctx)
{
    kvk_device *d = ctx;
    if (!d)
        return;
    if (d->dummy) {
        kvk_buffer_free(NULL, d->dummy);
        d->dummy = NULL;
    }
    destroy(d);
}

void kvk_caps(void *ctx, kiln_backend_caps *out)
{
    kvk_device *d = ctx;
    memset(out, 0, sizeof *out);
    for (int t = 0; t < KILN_DTYPE_COUNT; t++)
        out->dtype[t] = d->dtype_ok[t];
    out->host_memory = false;
    out->async = true;
}

bool kvk_supports(void *vq, const kiln_op_query *query)
{
    kvk_queue *q = vq;
    if ((unsigned)query->dtype >= KILN_DTYPE_COUNT || !q->d->dtype_ok[query->dtype])
        return false;
    if (kvk_nn_supports)
        switch (query->entry) {
        case KILN_ENTRY_MATMUL:
        case KILN_ENTRY_CONV:
        case KILN_ENTRY_CONV_BACKWARD_INPUT:
        case KILN_ENTRY_CONV_BACKWARD_WEIGHT:
        case KILN_ENTRY_CONV_FUSED:
        case KILN_ENTRY_CONV_PACK:
        case KILN_ENTRY_EPILOGUE:
        case KILN_ENTRY_POOL:
        case KILN_ENTRY_POOL_BACKWARD:
        case KILN_ENTRY_ADAPTIVE_AVG_POOL:
        case KILN_ENTRY_ADAPTIVE_AVG_POOL_BACKWARD:
        case KILN_ENTRY_INTERPOLATE:
        case KILN_ENTRY_INTERPOLATE_BACKWARD:
        case KILN_ENTRY_SOFTMAX:
        case KILN_ENTRY_LAYER_NORM:
        case KILN_ENTRY_ADAM_STEP:
        case KILN_ENTRY_RNN: return kvk_nn_supports(q, query);
        default: break;
        }
    return true;
}

int kvk_list(kiln_device_info *out, int max)
{
    VkInstance inst;
    if (get_instance(&inst) != VK_SUCCESS)
        return 0; /* no driver: nothing to list */
    uint32_t n = 0;
    VkPhysicalDevice *all = list_physical(inst, &n, "kiln_device_list");
    if (!all)
        return -1;
    for (uint32_t i = 0; i < n && (int)i < max; i++) {
        VkPhysicalDeviceProperties props;
        VkPhysicalDeviceMemoryProperties mem;
        vkGetPhysicalDeviceProperties(all[i], &props);
        vkGetPhysicalDeviceMemoryProperties(all[i], &mem);
        kiln_device_info *d = &out[i];
        memset(d, 0, sizeof *d);
        snprintf(d->spec, sizeof d->spec, "vulkan:%u", i);
        snprintf(d->name, sizeof d->name, "%.127s", props.deviceName);
        describe_driver(all[i], d->driver, sizeof d->driver);
        d->memory_bytes = device_local_bytes(&mem);
    }
    free(all);
    return (int)n;
}

const char *kvk_lost(void *ctx)
{
    kvk_device *d = ctx;
    if (!atomic_load(&d->lost))
        return NULL;
    /* per thread, so two callers never write one buffer */
    static _Thread_local char msg[256];
    snprintf(msg, sizeof msg, "vulkan:%d: the device '%.200s' was lost (VK_ERROR_DEVICE_LOST)", d->index, d->name);
    return msg;
}
