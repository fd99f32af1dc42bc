/*
 * backends/vulkan/vk-backend.c — the Vulkan backend's interface table. Every entry lives
 * in the file its vk-impl.h section names; the nn entries are weak there, so one whose
 * file is not built leaves its slot NULL.
 */
#include "vk-impl.h"

static const kiln_backend_iface vulkan_iface = {
    .name = "vulkan",
    .open = kvk_open,
    .close = kvk_close,
    .caps = kvk_caps,
    .list = kvk_list,
    .lost = kvk_lost,
    .memory = kvk_memory,
    .memory_reset_peak = kvk_memory_reset_peak,
    .queue_open = kvk_queue_open,
    .queue_close = kvk_queue_close,
    .event_record = kvk_event_record,
    .event_wait = kvk_event_wait,
    .event_sync = kvk_event_sync,
    .event_query = kvk_event_query,
    .event_free = kvk_event_free,
    .supports = kvk_supports,
    .buffer_alloc = kvk_buffer_alloc,
    .buffer_free = kvk_buffer_free,
    .buffer_detach = kvk_buffer_detach,
    .buffer_reattach = kvk_buffer_reattach,
    .buffer_upload = kvk_buffer_upload,
    .buffer_download = kvk_buffer_download,
    .buffer_trim = kvk_buffer_trim,
    .sync = kvk_sync,
    .fused_run = kvk_fused_run,
    .fill = kvk_fill,
    .arange = kvk_arange,
    .copy = kvk_copy,
    .rng = kvk_rng,
    .unary = kvk_unary,
    .binary = kvk_binary,
    .where = kvk_where,
    .reduce = kvk_reduce,
    .arg_reduce = kvk_arg_reduce,
    .cumsum = kvk_cumsum,
    .sort = kvk_sort,
    .index_check = kvk_index_check,
    .gather = kvk_gather,
    .scatter = kvk_scatter,
    .index_select = kvk_index_select,
    .index_add = kvk_index_add,
    .pad = kvk_pad,
    .matmul = kvk_matmul,
    .conv = kvk_conv,
    .conv_backward_input = kvk_conv_backward_input,
    .conv_backward_weight = kvk_conv_backward_weight,
    .conv_fused = kvk_conv_fused,
    .conv_pack_size = kvk_conv_pack_size,
    .conv_pack = kvk_conv_pack,
    .epilogue = kvk_epilogue,
    .pool = kvk_pool,
    .pool_backward = kvk_pool_backward,
    .adaptive_avg_pool = kvk_adaptive_avg_pool,
    .adaptive_avg_pool_backward = kvk_adaptive_avg_pool_backward,
    .interpolate = kvk_interpolate,
    .interpolate_backward = kvk_interpolate_backward,
    .softmax = kvk_softmax,
    .layer_norm = kvk_layer_norm,
    .adam_step = kvk_adam_step,
    .rnn = kvk_rnn,
};

const kiln_backend_iface *kiln_backend_vulkan(void);

const kiln_backend_iface *kiln_backend_vulkan(void)
{
    return &vulkan_iface;
}
