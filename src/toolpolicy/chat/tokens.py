"""The spellings of ChatML framing and Hermes tool-call tags (Qwen2.5's special tokens)."""

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"

# In Qwen2.5's id order. ENDOFTEXT is the pad token and the end-of-document marker.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, TOOL_CALL_START, TOOL_CALL_END, TOOL_RESPONSE_START, TOOL_RESPONSE_END)
