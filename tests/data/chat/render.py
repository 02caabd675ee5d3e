# SPDX-License-Identifier: MIT
# Prints the expected renderings of tests/test_chat.c: each template here rendered by jinja2 as
# transformers apply_chat_template does (sandboxed, trim_blocks, lstrip_blocks, add_generation_prompt),
# the leading BOS removed. Run from this folder: python3 render.py (needs jinja2; not run by ctest).
import jinja2, json
from jinja2.sandbox import ImmutableSandboxedEnvironment
def raise_exception(m): raise Exception(m)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.globals['raise_exception'] = raise_exception
convs = {
 'one': [("user","Hello!")],
 'sys': [("system","Be brief."),("user","Hi"),("assistant","Hello."),("user","What is 2+2? ")],
 'ws': [("system","  sys\u00a0"),("user","\u3000 padded \n"),("assistant"," ok \u2003"),("user","again")],
 'nosys': [("user","Hi"),("assistant","Hello."),("user","Bye")],
 'think': [("user","q1"),("assistant","<think>\nreasoning\n</think>\n\nanswer1"),("user","q2")],
 'think_last': [("user","q"),("assistant","<think>r</think>\n\na")],
}
tpls = [('qwen2-instruct.jinja','','',None), ('chatml.jinja','','',None), ('smollm2-instruct.jinja','','',None), ('qwen2.5-instruct.jinja','','',None), ('qwen3.jinja','','',None),
        ('llama-3-instruct.jinja','<|begin_of_text|>','<|eot_id|>',None), ('llama-3.3-instruct.jinja','<|begin_of_text|>','<|eot_id|>',None),
        ('llama-3.2-instruct.jinja','<|begin_of_text|>','<|eot_id|>','@DATE@'),
        ('gemma-3-it.jinja','<bos>','<eos>',None), ('llama-2-chat.jinja','<s>','</s>',None), ('mistral-7b-instruct-v0.1.jinja','<s>','</s>',None)]
def c(s):
    out=''
    for ch in s.encode():
        if ch==10: out+='\\n'
        elif ch==34: out+='\\"'
        elif ch==92: out+='\\\\'
        elif 32<=ch<127: out+=chr(ch)
        else: out+='\\x%02x""'%ch
    return '"'+out+'"'
for f,bos,eos,date in tpls:
    t = env.from_string(open(f).read())
    for name,msgs in convs.items():
        kw = dict(messages=[{"role":r,"content":x} for r,x in msgs], add_generation_prompt=True, bos_token=bos, eos_token=eos)
        if date: kw['strftime_now']=lambda fmt: date
        try: s = t.render(**kw)
        except Exception as e:
            print('/* %s %s: %s */'%(f,name,e)); continue
        assert s.startswith(bos); s = s[len(bos):]
        print('{"%s", "%s", %s},'%(f,name,c(s)))
