"""Chat templates in the shape of the three tool-calling families, written for the tests (each
renders tools, past calls and tool results the way its family does), sent as a request's
``chat_template`` to a server started with --trust-request-chat-template. The built-in template
(SmolLM2's ChatML, which knows no tools) is the server's own."""

from __future__ import annotations

HERMES = """{%- if tools %}<|im_start|>system
{{ messages[0]['content'] if messages[0]['role'] == 'system' else 'You are a helpful assistant.' }}

# Tools

<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>

For each call, return <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message['role'] == 'system' and tools %}
{%- elif message['role'] == 'tool' %}<|im_start|>user
<tool_response>
{{ message['content'] }}
</tool_response><|im_end|>
{% elif message['role'] == 'assistant' and message.get('tool_calls') %}<|im_start|>assistant
{{ message['content'] or '' }}
{%- for call in message['tool_calls'] %}
<tool_call>
{"name": "{{ call['function']['name'] }}", "arguments": {{ call['function']['arguments'] | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

LLAMA3 = """<|begin_of_text|>
{%- if tools %}<|start_header_id|>system<|end_header_id|>

Environment: ipython
Answer a function call as {"name": function name, "parameters": arguments object}. Functions:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}<|eot_id|>
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ message['content'] }}<|eot_id|>
{%- elif message.get('tool_calls') %}<|start_header_id|>assistant<|end_header_id|>

{%- for call in message['tool_calls'] %}
{"name": "{{ call['function']['name'] }}", "parameters": {{ call['function']['arguments'] | tojson }}}
{%- endfor %}<|eom_id|>
{%- else %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>

{{ message['content'] }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}{#- <|python_tag|> would start a built-in tool call #}"""

MISTRAL = """<s>
{%- if tools %}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}
{%- for message in messages %}
{%- if message['role'] == 'user' or message['role'] == 'system' %}[INST] {{ message['content'] }}[/INST]
{%- elif message['role'] == 'tool' %}[TOOL_RESULTS] {"content": {{ message['content'] | tojson }}}[/TOOL_RESULTS]
{%- elif message.get('tool_calls') %}[TOOL_CALLS] [
{%- for call in message['tool_calls'] %}
{%- set arguments = call['function']['arguments'] | tojson %}
{"name": "{{ call['function']['name'] }}", "arguments": {{ arguments }}}{% if not loop.last %}, {% endif %}
{%- endfor %}]</s>
{%- else %} {{ message['content'] }}</s>
{%- endif %}
{%- endfor %}"""

# name -> template sent in the request (None: the server's built-in one)
FAMILIES = {"builtin-chatml": None, "hermes": HERMES, "llama3_json": LLAMA3, "mistral": MISTRAL}
