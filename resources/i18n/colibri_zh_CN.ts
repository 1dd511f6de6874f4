<?xml version="1.0" encoding="utf-8"?>
<!DOCTYPE TS>
<TS version="2.1" language="zh_CN" sourcelanguage="en">
<context>
    <name>MainWindow</name>
    <message>
        <source>Use a &amp;remote endpoint…</source>
        <translation>使用远程端点(&amp;R)…</translation>
    </message>
    <message>
        <source>Se&amp;rver</source>
        <translation>服务器(&amp;R)</translation>
    </message>
    <message>
        <source>Serve on &amp;localhost</source>
        <translation>在本机提供服务(&amp;L)</translation>
    </message>
    <message>
        <source>An OpenAI-compatible API at http://127.0.0.1:{port}/v1 for editors, agents and scripts</source>
        <translation>在 http://127.0.0.1:{port}/v1 提供 OpenAI 兼容的 API，供编辑器、智能体和脚本使用</translation>
    </message>
    <message>
        <source>Local server address</source>
        <translation>本机服务地址</translation>
    </message>
    <message>
        <source>New chat</source>
        <translation>新建对话</translation>
    </message>
    <message>
        <source>Start a new conversation (Ctrl+N)</source>
        <translation>开始一个新对话 (Ctrl+N)</translation>
    </message>
    <message>
        <source>Search chats</source>
        <translation>搜索对话</translation>
    </message>
    <message>
        <source>Show only the chats whose title or messages contain this text</source>
        <translation>只显示标题或消息包含此文字的对话</translation>
    </message>
    <message>
        <source>Conversations</source>
        <translation>对话列表</translation>
    </message>
    <message>
        <source>Your chats, newest first; the context menu renames or deletes one</source>
        <translation>你的对话，最新的在前；右键菜单可重命名或删除</translation>
    </message>
    <message>
        <source>Chat title</source>
        <translation>对话标题</translation>
    </message>
    <message>
        <source>Model</source>
        <translation>模型</translation>
    </message>
    <message>
        <source>The model that writes the replies; the last entry imports one</source>
        <translation>生成回复的模型；最后一项用于导入模型</translation>
    </message>
    <message>
        <source>Chat settings</source>
        <translation>对话设置</translation>
    </message>
    <message>
        <source>System prompt and sampling of this chat</source>
        <translation>此对话的系统提示词和采样参数</translation>
    </message>
    <message>
        <source>Settings</source>
        <translation>设置</translation>
    </message>
    <message>
        <source>Engine and appearance settings (Ctrl+,)</source>
        <translation>引擎和外观设置 (Ctrl+,)</translation>
    </message>
    <message>
        <source>Conversation</source>
        <translation>对话内容</translation>
    </message>
    <message>
        <source>The messages of this chat; links edit, regenerate or copy</source>
        <translation>此对话的消息；其中的链接可编辑、重新生成或复制</translation>
    </message>
    <message>
        <source>Message</source>
        <translation>消息</translation>
    </message>
    <message>
        <source>Enter sends, Shift+Enter adds a line, Esc stops a reply</source>
        <translation>Enter 发送，Shift+Enter 换行，Esc 停止回复</translation>
    </message>
    <message>
        <source>Speed</source>
        <translation>速度</translation>
    </message>
    <message>
        <source>Context used</source>
        <translation>已用上下文</translation>
    </message>
    <message>
        <source>Memory used</source>
        <translation>已用内存</translation>
    </message>
    <message>
        <source>&amp;File</source>
        <translation>文件(&amp;F)</translation>
    </message>
    <message>
        <source>&amp;New chat</source>
        <translation>新建对话(&amp;N)</translation>
    </message>
    <message>
        <source>Convert model…</source>
        <translation>转换模型…</translation>
    </message>
    <message>
        <source>Export chat as &amp;Markdown…</source>
        <translation>将对话导出为 &amp;Markdown…</translation>
    </message>
    <message>
        <source>Export chat as &amp;JSON…</source>
        <translation>将对话导出为 &amp;JSON…</translation>
    </message>
    <message>
        <source>&amp;Quit</source>
        <translation>退出(&amp;Q)</translation>
    </message>
    <message>
        <source>&amp;Chat</source>
        <translation>对话(&amp;C)</translation>
    </message>
    <message>
        <source>&amp;Send</source>
        <translation>发送(&amp;S)</translation>
    </message>
    <message>
        <source>S&amp;top</source>
        <translation>停止(&amp;T)</translation>
    </message>
    <message>
        <source>&amp;Regenerate</source>
        <translation>重新生成(&amp;R)</translation>
    </message>
    <message>
        <source>&amp;Edit last message</source>
        <translation>编辑上一条消息(&amp;E)</translation>
    </message>
    <message>
        <source>Re&amp;name chat…</source>
        <translation>重命名对话(&amp;N)…</translation>
    </message>
    <message>
        <source>&amp;Delete chat</source>
        <translation>删除对话(&amp;D)</translation>
    </message>
    <message>
        <source>Chat se&amp;ttings…</source>
        <translation>对话设置(&amp;T)…</translation>
    </message>
    <message>
        <source>Go to the &amp;message box</source>
        <translation>转到消息输入框(&amp;M)</translation>
    </message>
    <message>
        <source>&amp;View</source>
        <translation>视图(&amp;V)</translation>
    </message>
    <message>
        <source>Toggle &amp;dark theme</source>
        <translation>切换深色主题(&amp;D)</translation>
    </message>
    <message>
        <source>&amp;Settings…</source>
        <translation>设置(&amp;S)…</translation>
    </message>
    <message>
        <source>Performance dashboard</source>
        <translation>性能仪表盘</translation>
    </message>
    <message>
        <source>Copied to the clipboard</source>
        <translation>已复制到剪贴板</translation>
    </message>
    <message>
        <source>The new language applies when Colibri next starts.</source>
        <translation>新的界面语言将在 Colibri 下次启动时生效。</translation>
    </message>
    <message>
        <source>— tok/s</source>
        <translation>— 词元/秒</translation>
    </message>
    <message>
        <source>Tokens of this chat in the model's context, and how many it holds</source>
        <translation>此对话在模型上下文中占用的词元数，以及上下文的容量</translation>
    </message>
    <message>
        <source>Thinking</source>
        <translation>思考</translation>
    </message>
    <message>
        <source>Let the model think before it answers, in this chat (its template&apos;s enable_thinking switch)</source>
        <translation>让模型在回答前先思考（仅此对话；即模板的 enable_thinking 开关）</translation>
    </message>
    <message>
        <source>The messages of this chat; links edit, regenerate, continue, copy, browse versions and fold thinking</source>
        <translation>此对话的消息；链接可编辑、重新生成、继续、复制、浏览版本和折叠思考</translation>
    </message>
    <message>
        <source>C&amp;ontinue the reply</source>
        <translation>继续回复(&amp;O)</translation>
    </message>
    <message>
        <source>Older version of the reply</source>
        <translation>回复的上一个版本</translation>
    </message>
    <message>
        <source>Newer version of the reply</source>
        <translation>回复的下一个版本</translation>
    </message>
    <message>
        <source>Show or hide the last &amp;thinking</source>
        <translation>显示或隐藏最近的思考(&amp;T)</translation>
    </message>
    <message>
        <source>Server &amp;panel</source>
        <translation>服务器面板(&amp;P)</translation>
    </message>
</context>
<context>
    <name>ChatView</name>
    <message>
        <source>interrupted: the app closed while it was written</source>
        <translation>已中断：写到一半时应用关闭了</translation>
    </message>
    <message>
        <source>Conversation</source>
        <translation>对话内容</translation>
    </message>
    <message>
        <source>You</source>
        <translation>你</translation>
    </message>
    <message>
        <source>Assistant</source>
        <translation>助手</translation>
    </message>
    <message>
        <source>Copy</source>
        <translation>复制</translation>
    </message>
    <message>
        <source>Regenerate</source>
        <translation>重新生成</translation>
    </message>
    <message>
        <source>{n} tokens</source>
        <translation>{n} 个词元</translation>
    </message>
    <message>
        <source>{rate:.1f} tok/s</source>
        <translation>{rate:.1f} 词元/秒</translation>
    </message>
    <message>
        <source>first token {ttft:.2f} s</source>
        <translation>首词元 {ttft:.2f} 秒</translation>
    </message>
    <message>
        <source>stopped</source>
        <translation>已停止</translation>
    </message>
    <message>
        <source>hit the token limit</source>
        <translation>达到词元上限</translation>
    </message>
    <message>
        <source>the context is full</source>
        <translation>上下文已满</translation>
    </message>
    <message>
        <source>thinking on</source>
        <translation>思考开启</translation>
    </message>
    <message>
        <source>thinking off</source>
        <translation>思考关闭</translation>
    </message>
    <message>
        <source>Thinking… {n} tokens</source>
        <translation>思考中… {n} 个词元</translation>
    </message>
    <message>
        <source>Thinking…</source>
        <translation>思考中…</translation>
    </message>
    <message>
        <source>Thought for {n} tokens</source>
        <translation>思考了 {n} 个词元</translation>
    </message>
    <message>
        <source>Thoughts</source>
        <translation>思考内容</translation>
    </message>
    <message>
        <source>Details</source>
        <translation>详情</translation>
    </message>
    <message>
        <source>Continue</source>
        <translation>继续</translation>
    </message>
    <message>
        <source>Edit</source>
        <translation>编辑</translation>
    </message>
    <message>
        <source>Delete</source>
        <translation>删除</translation>
    </message>
</context>
<context>
    <name>MessageInput</name>
    <message>
        <source>Message Colibri — Enter sends, Shift+Enter adds a line</source>
        <translation>给 Colibri 发消息 — Enter 发送，Shift+Enter 换行</translation>
    </message>
    <message>
        <source>Message</source>
        <translation>消息</translation>
    </message>
</context>
<context>
    <name>ConversationDialog</name>
    <message>
        <source>Chat settings</source>
        <translation>对话设置</translation>
    </message>
    <message>
        <source>e.g. You are a concise assistant.</source>
        <translation>例如：你是一个简洁的助手。</translation>
    </message>
    <message>
        <source>System prompt</source>
        <translation>系统提示词</translation>
    </message>
    <message>
        <source>&amp;System prompt</source>
        <translation>系统提示词(&amp;S)</translation>
    </message>
    <message>
        <source>Sampling</source>
        <translation>采样</translation>
    </message>
    <message>
        <source>This model recommends: {values} (from its generation config); Restore defaults uses them.</source>
        <translation>此模型推荐：{values}（来自其生成配置）；“恢复默认值”会使用这些值。</translation>
    </message>
    <message>
        <source>This model recommends no sampling values: the defaults below are Colibri's.</source>
        <translation>此模型没有推荐的采样参数：下面的默认值来自 Colibri。</translation>
    </message>
    <message>
        <source>Preset</source>
        <translation>预设</translation>
    </message>
    <message>
        <source>A named system prompt and sampling: picking one fills the fields below</source>
        <translation>已命名的系统提示词和采样参数：选择一个即可填入下面的字段</translation>
    </message>
    <message>
        <source>Save as preset…</source>
        <translation>另存为预设…</translation>
    </message>
    <message>
        <source>Save as preset</source>
        <translation>另存为预设</translation>
    </message>
    <message>
        <source>Use for new chats</source>
        <translation>用于新对话</translation>
    </message>
    <message>
        <source>Use this preset for new chats</source>
        <translation>新对话使用此预设</translation>
    </message>
    <message>
        <source>&amp;Preset</source>
        <translation>预设(&amp;P)</translation>
    </message>
    <message>
        <source>New chats start from “{name}”.</source>
        <translation>新对话从“{name}”开始。</translation>
    </message>
    <message>
        <source>Name of the preset:</source>
        <translation>预设名称：</translation>
    </message>
</context>
<context>
    <name>ConversationListModel</name>
    <message>
        <source>New chat</source>
        <translation>新对话</translation>
    </message>
</context>
<context>
    <name>SettingsDialog</name>
    <message>
        <source>Settings</source>
        <translation>设置</translation>
    </message>
    <message>
        <source>Settings sections</source>
        <translation>设置分类</translation>
    </message>
    <message>
        <source>&amp;Engine</source>
        <translation>引擎(&amp;E)</translation>
    </message>
    <message>
        <source>&amp;Appearance</source>
        <translation>外观(&amp;A)</translation>
    </message>
    <message>
        <source>What fits in memory</source>
        <translation>内存能容纳什么</translation>
    </message>
    <message>
        <source>Working out what the model needs with these settings…</source>
        <translation>正在计算此设置下模型所需的内存…</translation>
    </message>
</context>
<context>
    <name>ModelFlow</name>
    <message>
        <source>Preparing {name}</source>
        <translation>正在准备 {name}</translation>
    </message>
    <message>
        <source>Converting the default model into your data folder (first run only).</source>
        <translation>正在把默认模型转换到你的数据文件夹（仅首次运行）。</translation>
    </message>
    <message>
        <source>Loading</source>
        <translation>加载中</translation>
    </message>
    <message>
        <source>looking for your model</source>
        <translation>正在查找你的模型</translation>
    </message>
    <message>
        <source>Loading {name}</source>
        <translation>加载 {name}</translation>
    </message>
    <message>
        <source>checking memory</source>
        <translation>正在检查内存</translation>
    </message>
    <message>
        <source>Importing {name}</source>
        <translation>正在导入 {name}</translation>
    </message>
    <message>
        <source>Converting into your model library…</source>
        <translation>正在转换到你的模型库…</translation>
    </message>
    <message>
        <source>Cancel</source>
        <translation>取消</translation>
    </message>
    <message>
        <source>Converting {tensor}  ({fraction:.0%})</source>
        <translation>正在转换 {tensor}  ({fraction:.0%})</translation>
    </message>
    <message>
        <source>Not enough memory</source>
        <translation>内存不足</translation>
    </message>
    <message>
        <source>{model} will not fit in memory.</source>
        <translation>{model} 无法装入内存。</translation>
    </message>
    <message>
        <source>Load anyway</source>
        <translation>仍然加载</translation>
    </message>
    <message>
        <source>The conversion was cancelled; nothing was written.</source>
        <translation>转换已取消；没有写入任何内容。</translation>
    </message>
    <message>
        <source>{what} failed.</source>
        <translation>{what}失败。</translation>
    </message>
    <message>
        <source>Generating a reply</source>
        <translation>生成回复</translation>
    </message>
    <message>
        <source>Defragmenting the memory pool</source>
        <translation>整理内存池</translation>
    </message>
    <message>
        <source>Reading the engine's figures</source>
        <translation>读取引擎数据</translation>
    </message>
    <message>
        <source>Converting the default model</source>
        <translation>转换默认模型</translation>
    </message>
    <message>
        <source>Exporting the chat</source>
        <translation>导出对话</translation>
    </message>
    <message>
        <source>Converting {name}</source>
        <translation>转换 {name}</translation>
    </message>
    <message>
        <source>Setting {name}</source>
        <translation>设置 {name}</translation>
    </message>
    <message>
        <source>Reading {name}</source>
        <translation>读取 {name}</translation>
    </message>
</context>
<context>
    <name>Dashboard</name>
    <message>
        <source>Colibri — performance</source>
        <translation>Colibri — 性能</translation>
    </message>
    <message>
        <source>Performance dashboard</source>
        <translation>性能仪表盘</translation>
    </message>
    <message>
        <source>No model is loaded.</source>
        <translation>没有加载模型。</translation>
    </message>
    <message>
        <source>Memory pool</source>
        <translation>内存池</translation>
    </message>
    <message>
        <source>used</source>
        <translation>已用</translation>
    </message>
    <message>
        <source>free</source>
        <translation>空闲</translation>
    </message>
    <message>
        <source>blocks</source>
        <translation>块数</translation>
    </message>
    <message>
        <source>fragmented</source>
        <translation>碎片率</translation>
    </message>
    <message>
        <source>small</source>
        <translation>小</translation>
    </message>
    <message>
        <source>medium</source>
        <translation>中</translation>
    </message>
    <message>
        <source>large</source>
        <translation>大</translation>
    </message>
    <message>
        <source>all</source>
        <translation>全部</translation>
    </message>
    <message>
        <source>&amp;Defrag</source>
        <translation>整理(&amp;D)</translation>
    </message>
    <message>
        <source>Defragment the memory pool</source>
        <translation>整理内存池</translation>
    </message>
    <message>
        <source>Free the expert cache&apos;s spare slots and give the pool&apos;s free pages back to the system (nothing is moved)</source>
        <translation>释放专家缓存的备用槽，并把内存池的空闲页还给系统（不移动任何内存）</translation>
    </message>
    <message>
        <source>Speed</source>
        <translation>速度</translation>
    </message>
    <message>
        <source>Expert cache: hit rate and prefetch accuracy</source>
        <translation>专家缓存：命中率与预取准确率</translation>
    </message>
    <message>
        <source>Expert activations (layer × expert)</source>
        <translation>专家激活（层 × 专家）</translation>
    </message>
    <message>
        <source>Memory (RSS)</source>
        <translation>内存 (RSS)</translation>
    </message>
    <message>
        <source>CPU load</source>
        <translation>CPU 负载</translation>
    </message>
    <message>
        <source>CPU temperature and threads</source>
        <translation>CPU 温度与线程</translation>
    </message>
    <message>
        <source>Power</source>
        <translation>功耗</translation>
    </message>
    <message>
        <source>GPU</source>
        <translation>GPU</translation>
    </message>
    <message>
        <source>Defragmenting… (after the reply being written, if any)</source>
        <translation>正在整理…（如有正在生成的回复，会在其结束后进行）</translation>
    </message>
    <message>
        <source>No advice: nothing in these figures asks for a change.</source>
        <translation>暂无建议：这些数据没有显示需要调整的地方。</translation>
    </message>
    <message>
        <source>Advice</source>
        <translation>建议</translation>
    </message>
    <message>
        <source>Performance</source>
        <translation>性能</translation>
    </message>
    <message>
        <source>Memory handed out to the engine's buffers</source>
        <translation>已分配给引擎缓冲区的内存</translation>
    </message>
    <message>
        <source>Memory the pool holds from the system but has not handed out</source>
        <translation>内存池向系统申请但尚未分配出去的内存</translation>
    </message>
    <message>
        <source>Live buffers</source>
        <translation>正在使用的缓冲区</translation>
    </message>
    <message>
        <source>Share of the free memory that is scattered: small tier, free slots in slab pages that still hold live buffers (they cannot go back to the system); medium tier, free memory outside its largest free piece. Nothing is ever moved, so Defrag cannot lower it</source>
        <translation>空闲内存中零散部分的比例：小块层是仍有缓冲区在用的 slab 页中的空闲槽（无法还给系统）；中块层是最大空闲块之外的空闲内存。内存从不移动，所以碎片整理无法降低它</translation>
    </message>
    <message>
        <source>Dashboard panels</source>
        <translation>仪表盘面板</translation>
    </message>
    <message>
        <source>Waiting for the engine's first figures (a reply being written sends them between its words)…</source>
        <translation>正在等待引擎的第一批数据（正在生成的回复会在词元之间发送）…</translation>
    </message>
    <message>
        <source>Nothing to give back: the pool had no free pages it could release · {rss}</source>
        <translation>没有可归还的内存：内存池中没有可释放的空闲页 · {rss}</translation>
    </message>
    <message>
        <source>Gave {size} back to the system · {rss}</source>
        <translation>已向系统归还 {size} · {rss}</translation>
    </message>
    <message>
        <source>Released {size} of free pool pages, but RSS did not drop by as much ({rss}): most of those pages were never in physical memory, or the system has not reclaimed them yet</source>
        <translation>已释放 {size} 的空闲内存池页，但 RSS 没有相应下降（{rss}）：这些页大多从未驻留在物理内存中，或系统尚未回收</translation>
    </message>
    <message>
        <source>decode tok/s (line)</source>
        <translation>解码 词元/秒（折线）</translation>
    </message>
    <message>
        <source>prefill tok/s (dots)</source>
        <translation>预填充 词元/秒（圆点）</translation>
    </message>
    <message>
        <source>A dense model: one MLP per layer, no experts to pick.
Load a Mixture-of-Experts model to see which experts each layer uses.</source>
        <translation>稠密模型：每层只有一个 MLP，没有可选的专家。
加载混合专家（MoE）模型即可查看每层使用了哪些专家。</translation>
    </message>
    <message>
        <source>fragmented: the share of free memory that is scattered (small: free slots in slab pages still in use, normal for slabs; medium: outside its largest free piece; nothing is moved, so Defrag cannot lower it)</source>
        <translation>碎片率：空闲内存中零散部分的比例（小块：仍在使用的 slab 页中的空闲槽，对 slab 来说很正常；中块：最大空闲块之外的部分；内存从不移动，所以碎片整理无法降低它）</translation>
    </message>
</context>
<context>
    <name>ConvertWizard</name>
    <message>
        <source>Convert a model</source>
        <translation>转换模型</translation>
    </message>
    <message>
        <source>Back</source>
        <translation>上一步</translation>
    </message>
    <message>
        <source>Next</source>
        <translation>下一步</translation>
    </message>
    <message>
        <source>Close</source>
        <translation>关闭</translation>
    </message>
    <message>
        <source>a .gguf file, or a folder with config.json and *.safetensors</source>
        <translation>一个 .gguf 文件，或包含 config.json 和 *.safetensors 的文件夹</translation>
    </message>
    <message>
        <source>Model source</source>
        <translation>模型来源</translation>
    </message>
    <message>
        <source>GGUF file…</source>
        <translation>GGUF 文件…</translation>
    </message>
    <message>
        <source>Choose a GGUF file</source>
        <translation>选择 GGUF 文件</translation>
    </message>
    <message>
        <source>Hugging Face folder…</source>
        <translation>Hugging Face 文件夹…</translation>
    </message>
    <message>
        <source>Choose a Hugging Face model folder</source>
        <translation>选择 Hugging Face 模型文件夹</translation>
    </message>
    <message>
        <source>Colibri runs models converted into its own folder format. Pick the model to convert: a GGUF file (as llama.cpp uses) or a Hugging Face folder with its config.json and *.safetensors weights. Nothing is downloaded and the source is never changed.</source>
        <translation>Colibri 运行转换成它自己文件夹格式的模型。请选择要转换的模型：一个 GGUF 文件（llama.cpp 使用的格式），或一个包含 config.json 和 *.safetensors 权重的 Hugging Face 文件夹。不会下载任何内容，也不会改动源文件。</translation>
    </message>
    <message>
        <source>Quantization: how each weight is stored</source>
        <translation>量化：每个权重的存储方式</translation>
    </message>
    <message>
        <source>Expert files</source>
        <translation>专家文件</translation>
    </message>
    <message>
        <source>One file per expert: a token reads only the experts it uses (recommended)</source>
        <translation>每个专家一个文件：每个词元只读取它用到的专家（推荐）</translation>
    </message>
    <message>
        <source>One file per layer: fewer, larger files</source>
        <translation>每层一个文件：文件更少、更大</translation>
    </message>
    <message>
        <source>experts in memory per layer</source>
        <translation>每层驻留内存的专家数</translation>
    </message>
    <message>
        <source>memory needed</source>
        <translation>所需内存</translation>
    </message>
    <message>
        <source>Memory by expert cache size</source>
        <translation>各专家缓存大小所需内存</translation>
    </message>
    <message>
        <source>Save as</source>
        <translation>保存为</translation>
    </message>
    <message>
        <source>&amp;Save as</source>
        <translation>保存为(&amp;S)</translation>
    </message>
    <message>
        <source>Cancel</source>
        <translation>取消</translation>
    </message>
    <message>
        <source>Cancel the conversion</source>
        <translation>取消转换</translation>
    </message>
    <message>
        <source>Open in chat</source>
        <translation>在对话中打开</translation>
    </message>
    <message>
        <source>1 · Choose the source</source>
        <translation>1 · 选择来源</translation>
    </message>
    <message>
        <source>2 · Choose how to store it</source>
        <translation>2 · 选择存储方式</translation>
    </message>
    <message>
        <source>3 · Convert</source>
        <translation>3 · 转换</translation>
    </message>
    <message>
        <source>Convert</source>
        <translation>转换</translation>
    </message>
    <message>
        <source>Reading {name}…</source>
        <translation>正在读取 {name}…</translation>
    </message>
    <message>
        <source>Give the model a name.</source>
        <translation>请给模型起个名字。</translation>
    </message>
    <message>
        <source>It will be written to {path}.</source>
        <translation>将写入 {path}。</translation>
    </message>
    <message>
        <source>A model with this name is in your library already: converting replaces it.</source>
        <translation>模型库中已有同名模型：转换会替换它。</translation>
    </message>
    <message>
        <source>Starting…</source>
        <translation>正在开始…</translation>
    </message>
    <message>
        <source>Cancelling…</source>
        <translation>正在取消…</translation>
    </message>
    <message>
        <source>Cancelled: nothing was written. Go back to change the options, or close.</source>
        <translation>已取消：没有写入任何内容。可返回修改选项，或关闭。</translation>
    </message>
    <message>
        <source>type or paste a .gguf file, or a folder with config.json and *.safetensors</source>
        <translation>输入或粘贴一个 .gguf 文件，或包含 config.json 和 *.safetensors 的文件夹</translation>
    </message>
    <message>
        <source>The path of the model to convert; Enter reads it</source>
        <translation>要转换的模型路径；按 Enter 读取</translation>
    </message>
    <message>
        <source>Reading the source</source>
        <translation>正在读取来源</translation>
    </message>
    <message>
        <source>what it means</source>
        <translation>含义</translation>
    </message>
    <message>
        <source>No file or folder at {path}</source>
        <translation>{path} 处没有文件或文件夹</translation>
    </message>
    <message>
        <source>Reading {name}{size}… {secs:.0f} s</source>
        <translation>正在读取 {name}{size}… {secs:.0f} 秒</translation>
    </message>
    <message>
        <source>Reading {name}{size}…</source>
        <translation>正在读取 {name}{size}…</translation>
    </message>
    <message>
        <source>Opening {name}…</source>
        <translation>正在打开 {name}…</translation>
    </message>
    <message>
        <source>Reading the header of {name}{size}: {pct:.0%}</source>
        <translation>正在读取 {name}{size} 的文件头：{pct:.0%}</translation>
    </message>
    <message>
        <source>The text reached all {experts} expert matrices.</source>
        <translation>该文本覆盖了全部 {experts} 个专家矩阵。</translation>
    </message>
    <message>
        <source>{n} of {experts}</source>
        <translation>{experts} 个中的 {n} 个</translation>
    </message>
    <message>
        <source>all (dense)</source>
        <translation>全部（稠密）</translation>
    </message>
    <message>
        <source>the fewest: the others load from disk</source>
        <translation>最少：其余的从磁盘加载</translation>
    </message>
    <message>
        <source>all experts in memory: never waits for the disk</source>
        <translation>全部专家在内存中：从不等待磁盘</translation>
    </message>
    <message>
        <source>dense model: all weights stay in memory</source>
        <translation>稠密模型：所有权重常驻内存</translation>
    </message>
    <message>
        <source>Weights always in memory ({dense}), the experts kept, and the KV cache for a {context:,}-token context in f16 ({kv}). Set the expert cache size in Settings after loading.</source>
        <translation>常驻内存的权重（{dense}）、缓存的专家，以及 {context:,} 词元上下文的 f16 KV 缓存（{kv}）。加载后可在“设置”中调整专家缓存大小。</translation>
    </message>
    <message>
        <source>Converting {name} ({q}) into {target}</source>
        <translation>正在把 {name}（{q}）转换到 {target}</translation>
    </message>
    <message>
        <source>Done: {size} written in {seconds:.1f} s ({kinds}). The model is in your library.</source>
        <translation>完成：{seconds:.1f} 秒内写入 {size}（{kinds}）。模型已在你的模型库中。</translation>
    </message>
    <message>
        <source>A text like the ones you will give the model (a few pages; at most 16,000 tokens are used). The converter runs the model over it first, which adds minutes, and rounds the weights that matter most more carefully.</source>
        <translation>一段与你今后交给模型的内容相似的文本（几页即可；最多使用 16,000 个词元）。转换器会先让模型读一遍它，这会多花几分钟，然后更仔细地舍入最重要的权重。</translation>
    </message>
    <message>
        <source>Calibration (optional)</source>
        <translation>校准（可选）</translation>
    </message>
    <message>
        <source>Calibration text</source>
        <translation>校准文本</translation>
    </message>
    <message>
        <source>A text file the converter runs the model over, to round the weights that matter most more carefully</source>
        <translation>转换器让模型读一遍的文本文件，用来更仔细地舍入最重要的权重</translation>
    </message>
    <message>
        <source>Calibration text…</source>
        <translation>校准文本…</translation>
    </message>
    <message>
        <source>Choose a calibration text file</source>
        <translation>选择校准文本文件</translation>
    </message>
    <message>
        <source>Text (*.txt *.md);;All files (*)</source>
        <translation>文本 (*.txt *.md);;所有文件 (*)</translation>
    </message>
    <message>
        <source>on disk</source>
        <translation>磁盘占用</translation>
    </message>
    <message>
        <source>memory from</source>
        <translation>内存（最少）</translation>
    </message>
    <message>
        <source>measured on the default model</source>
        <translation>在默认模型上实测</translation>
    </message>
    <message>
        <source>none: every weight counts the same</source>
        <translation>无：每个权重同等对待</translation>
    </message>
    <message>
        <source>{ppl:+.1f}% perplexity, {same:.0f}% same next token</source>
        <translation>困惑度 {ppl:+.1f}%，{same:.0f}% 下一词元相同</translation>
    </message>
    <message>
        <source>Calibrated on {tokens:,} tokens: {weighted} matrices rounded by importance.</source>
        <translation>已在 {tokens:,} 个词元上校准：{weighted} 个矩阵按重要性舍入。</translation>
    </message>
    <message>
        <source>Quality: one model&apos;s figures, the default model&apos;s ({model}, converted from that file and compared with its f16 over {positions} tokens); another model&apos;s cost differs.</source>
        <translation>质量：这是单个模型的数据，即默认模型（{model}，由该文件转换，并在 {positions} 个词元上与其 f16 比较）；其他模型的损失会不同。</translation>
    </message>
    <message>
        <source>calibrated: {figures}</source>
        <translation>校准后：{figures}</translation>
    </message>
    <message>
        <source>Only int8, q4_k_m and int4 round weights: {q} needs no calibration.</source>
        <translation>只有 int8、q4_k_m 和 int4 会舍入权重：{q} 不需要校准。</translation>
    </message>
    <message>
        <source>No file at {path}.</source>
        <translation>{path} 处没有文件。</translation>
    </message>
    <message>
        <source>measured on the default model: {figures}</source>
        <translation>在默认模型上实测：{figures}</translation>
    </message>
    <message>
        <source>{help}; {size} on disk, needs from {memory} of memory; {cost}</source>
        <translation>{help}；磁盘占用 {size}，至少需要 {memory} 内存；{cost}</translation>
    </message>
    <message>
        <source>{q} shows no loss there because that file was stored in {q}&apos;s format already; from 16 bits it costs more.</source>
        <translation>{q} 在那里没有损失，因为那个文件本来就以 {q} 的格式存储；从 16 位转换时损失会更大。</translation>
    </message>
    <message>
        <source>Running {name} over the calibration text {text} (a few minutes)…</source>
        <translation>正在让 {name} 读校准文本 {text}（需要几分钟）…</translation>
    </message>
    <message>
        <source>{unrouted} of {experts} expert matrices were never routed to by the text: they keep weight-only rounding.</source>
        <translation>{experts} 个专家矩阵中有 {unrouted} 个从未被该文本路由到：它们仅按权重本身舍入。</translation>
    </message>
    <message>
        <source>as the source stores them (a GGUF imports losslessly)</source>
        <translation>保持源文件的存储方式（GGUF 无损导入）</translation>
    </message>
    <message>
        <source>16-bit floats: practically lossless</source>
        <translation>16 位浮点：几乎无损</translation>
    </message>
    <message>
        <source>8 bits per weight: a very small loss</source>
        <translation>每个权重 8 位：损失很小</translation>
    </message>
    <message>
        <source>llama.cpp&apos;s Q4_K_M: ~5 bits, more where it matters</source>
        <translation>llama.cpp 的 Q4_K_M：约 5 位，关键处更多</translation>
    </message>
    <message>
        <source>4 bits per weight: a noticeable loss</source>
        <translation>每个权重 4 位：损失明显</translation>
    </message>
</context>
<context>
    <name>Param</name>
    <message>
        <source>Threads</source>
        <translation>线程数</translation>
    </message>
    <message>
        <source>compute threads (default: the number of physical cores)</source>
        <translation>计算线程数（默认：物理核心数）</translation>
    </message>
    <message>
        <source>Context length</source>
        <translation>上下文长度</translation>
    </message>
    <message>
        <source>tokens the KV cache holds (capped by the model's own limit)</source>
        <translation>KV 缓存可容纳的词元数（不超过模型自身的上限）</translation>
    </message>
    <message>
        <source>KV cache quantize</source>
        <translation>KV 缓存量化</translation>
    </message>
    <message>
        <source>KV cache storage: f32, f16 (half the memory) or int8 (a quarter)</source>
        <translation>KV 缓存的存储格式：f32、f16（一半内存）或 int8（四分之一）</translation>
    </message>
    <message>
        <source>Expert cache size</source>
        <translation>专家缓存大小</translation>
    </message>
    <message>
        <source>experts of each layer kept in memory; auto (default) sizes the cache from free memory, the model and the KV cache</source>
        <translation>每层保留在内存中的专家数；auto（默认）根据空闲内存、模型和 KV 缓存自动确定</translation>
    </message>
    <message>
        <source>Expert cache bytes</source>
        <translation>专家缓存字节数</translation>
    </message>
    <message>
        <source>expert cache budget in bytes, instead of a count per layer</source>
        <translation>以字节计的专家缓存预算，代替每层的专家数</translation>
    </message>
    <message>
        <source>Expert cache policy</source>
        <translation>专家缓存策略</translation>
    </message>
    <message>
        <source>which expert leaves a full expert cache first: lfu, the one least used lately (fewer misses on real routing), or lru, the one least recently used</source>
        <translation>专家缓存满时先移出哪个专家：lfu，近来用得最少的（在真实路由上未命中更少）；或 lru，最久未使用的</translation>
    </message>
    <message>
        <source>Prefetch window</source>
        <translation>预取窗口</translation>
    </message>
    <message>
        <source>tokens whose expert choices guide prefetching; 0 = no prefetch (experts load when needed)</source>
        <translation>用其专家选择来指导预取的词元数；0 = 不预取（需要时再加载专家）</translation>
    </message>
    <message>
        <source>Gpu layers</source>
        <translation>GPU 层数</translation>
    </message>
    <message>
        <source>layers whose attention runs on the NVIDIA GPU (numba-cuda), first layers first; other matmuls go where the cost model says; 0 = CPU only. No GPU: everything on the CPU</source>
        <translation>在 NVIDIA GPU 上运行注意力的层数（numba-cuda），从第一层开始；其他矩阵乘法按代价模型分配；0 = 仅 CPU。没有 GPU 时全部在 CPU 上运行</translation>
    </message>
    <message>
        <source>Batch size</source>
        <translation>批大小</translation>
    </message>
    <message>
        <source>prompt tokens processed per forward step during prefill</source>
        <translation>预填充时每个前向步骤处理的提示词元数</translation>
    </message>
    <message>
        <source>Simd</source>
        <translation>SIMD 指令集</translation>
    </message>
    <message>
        <source>instruction set the kernels are compiled for: auto (avx512 on AMD, where it measured faster; avx2 elsewhere, as many Intel CPUs clock down under AVX-512), avx2, or avx512; applied at the next start (COLIBRI_SIMD)</source>
        <translation>内核编译所用的指令集：auto（AMD 上用 avx512，实测更快；其他用 avx2，因为许多 Intel CPU 在 AVX-512 下会降频）、avx2 或 avx512；下次启动时生效（COLIBRI_SIMD）</translation>
    </message>
    <message>
        <source>Log level</source>
        <translation>日志级别</translation>
    </message>
    <message>
        <source>log verbosity</source>
        <translation>日志详细程度</translation>
    </message>
    <message>
        <source>Power limit</source>
        <translation>功耗上限</translation>
    </message>
    <message>
        <source>CPU package power limit in watts (Linux RAPL, long-term limit; needs root); auto = leave it as is; a limit we set is put back on exit</source>
        <translation>CPU 封装功耗上限，单位瓦（Linux RAPL 长期上限；需要 root）；auto = 保持不变；退出时恢复原设置</translation>
    </message>
    <message>
        <source>Gpu power limit</source>
        <translation>GPU 功耗上限</translation>
    </message>
    <message>
        <source>NVIDIA GPU power limit in watts (NVML; needs root; checked against the GPU's own range); auto = leave it as is; put back on exit</source>
        <translation>NVIDIA GPU 功耗上限，单位瓦（NVML；需要 root；按 GPU 自身范围检查）；auto = 保持不变；退出时恢复</translation>
    </message>
    <message>
        <source>Throttle high c</source>
        <translation>降频高温阈值 (°C)</translation>
    </message>
    <message>
        <source>CPU temperature (°C) above which the engine drops one thread per step</source>
        <translation>CPU 温度（°C）高于此值时，引擎每步减少一个线程</translation>
    </message>
    <message>
        <source>Throttle low c</source>
        <translation>恢复低温阈值 (°C)</translation>
    </message>
    <message>
        <source>CPU temperature (°C) below which dropped threads come back one per step; must be below throttle_high_c</source>
        <translation>CPU 温度（°C）低于此值时，减少的线程每步恢复一个；必须低于 throttle_high_c</translation>
    </message>
    <message>
        <source>Affinity</source>
        <translation>CPU 亲和性</translation>
    </message>
    <message>
        <source>pin the engine to one logical CPU per physical core (sched_setaffinity)</source>
        <translation>把引擎固定到每个物理核心的一个逻辑 CPU 上（sched_setaffinity）</translation>
    </message>
    <message>
        <source>Max tokens</source>
        <translation>最大词元数</translation>
    </message>
    <message>
        <source>most tokens to generate for one reply</source>
        <translation>一次回复最多生成的词元数</translation>
    </message>
    <message>
        <source>Temperature</source>
        <translation>温度</translation>
    </message>
    <message>
        <source>randomness; 0 = always the most likely token (greedy)</source>
        <translation>随机程度；0 = 总是选最可能的词元（贪心）</translation>
    </message>
    <message>
        <source>Top-k</source>
        <translation>Top-k</translation>
    </message>
    <message>
        <source>sample among the k most likely tokens; 0 = no limit</source>
        <translation>在最可能的 k 个词元中采样；0 = 不限制</translation>
    </message>
    <message>
        <source>Top-p</source>
        <translation>Top-p</translation>
    </message>
    <message>
        <source>sample among the most likely tokens whose probabilities sum to p</source>
        <translation>在概率之和达到 p 的最可能词元中采样</translation>
    </message>
    <message>
        <source>Min-p</source>
        <translation>Min-p</translation>
    </message>
    <message>
        <source>drop tokens less likely than min_p × the top token's probability</source>
        <translation>丢弃概率低于 min_p × 最高词元概率的词元</translation>
    </message>
    <message>
        <source>Repeat penalty</source>
        <translation>重复惩罚</translation>
    </message>
    <message>
        <source>penalise tokens seen in the last 64 tokens; 1 = off</source>
        <translation>惩罚最近 64 个词元中出现过的词元；1 = 关闭</translation>
    </message>
    <message>
        <source>Seed</source>
        <translation>随机种子</translation>
    </message>
    <message>
        <source>random seed; the same seed gives the same text</source>
        <translation>随机种子；相同的种子生成相同的文字</translation>
    </message>
    <message>
        <source>Theme</source>
        <translation>主题</translation>
    </message>
    <message>
        <source>colour theme of the window</source>
        <translation>窗口的配色主题</translation>
    </message>
    <message>
        <source>light</source>
        <translation>浅色</translation>
    </message>
    <message>
        <source>dark</source>
        <translation>深色</translation>
    </message>
    <message>
        <source>Font size</source>
        <translation>字号</translation>
    </message>
    <message>
        <source>text size of the conversation, in points</source>
        <translation>对话文字的大小，单位为磅</translation>
    </message>
    <message>
        <source>Language</source>
        <translation>界面语言</translation>
    </message>
    <message>
        <source>language of the interface (system: the desktop's, where translated); applied at the next start</source>
        <translation>界面语言（system：跟随桌面语言，如有译文）；下次启动时生效</translation>
    </message>
    <message>
        <source>system</source>
        <translation>跟随系统</translation>
    </message>
    <message>
        <source>auto</source>
        <translation>自动</translation>
    </message>
    <message>
        <source>random</source>
        <translation>随机</translation>
    </message>
    <message>
        <source>default</source>
        <translation>默认</translation>
    </message>
    <message>
        <source>as is</source>
        <translation>保持不变</translation>
    </message>
    <message>
        <source>applies at once; the next reply reads the conversation again</source>
        <translation>立即生效；下一次回复会重新读取整个对话</translation>
    </message>
    <message>
        <source>Light</source>
        <translation>浅色</translation>
    </message>
    <message>
        <source>Dark</source>
        <translation>深色</translation>
    </message>
    <message>
        <source>Same as the desktop</source>
        <translation>跟随桌面</translation>
    </message>
    <message>
        <source>Automatic</source>
        <translation>自动</translation>
    </message>
    <message>
        <source>Unit</source>
        <translation>单位</translation>
    </message>
    <message>
        <source>{free} free now, of {total}</source>
        <translation>当前可用 {free}，共 {total}</translation>
    </message>
    <message>
        <source>not set</source>
        <translation>未设置</translation>
    </message>
    <message>
        <source>language of the interface (the desktop's, where translated); applied at once</source>
        <translation>界面语言（默认跟随桌面语言，如有译文）；立即生效</translation>
    </message>
    <message>
        <source>Model defaults</source>
        <translation>模型默认</translation>
    </message>
    <message>
        <source>Precise</source>
        <translation>精确</translation>
    </message>
    <message>
        <source>Creative</source>
        <translation>创意</translation>
    </message>
    <message>
        <source>Coding</source>
        <translation>编程</translation>
    </message>
</context>
<context>
    <name>Main</name>
    <message>
        <source>The conversation history cannot be opened, so Colibri cannot start.</source>
        <translation>无法打开对话历史，Colibri 无法启动。</translation>
    </message>
    <message>
        <source>An interrupted model replacement was undone: {path} is the previous model again.</source>
        <translation>已撤销一次被中断的模型替换：{path} 恢复为之前的模型。</translation>
    </message>
</context>
<context>
    <name>ContextUi</name>
    <message>
        <source>With the message you are writing, this chat's next prompt takes {used:,} of the model's {limit:,} context tokens</source>
        <translation>加上你正在写的消息，此对话的下一个提示占用模型 {limit:,} 个上下文词元中的 {used:,} 个</translation>
    </message>
    <message>
        <source>From here, {n} messages are not sent to the model: the context is full</source>
        <translation>从这里起的 {n} 条消息不会发送给模型：上下文已满</translation>
    </message>
    <message>
        <source>The model reads on from here (this chat&apos;s policy: {policy})</source>
        <translation>模型从这里接着读（此对话的策略：{policy}）</translation>
    </message>
    <message>
        <source>Drop the oldest messages</source>
        <translation>丢弃最早的消息</translation>
    </message>
    <message>
        <source>Keep the start, drop the middle</source>
        <translation>保留开头，丢弃中间</translation>
    </message>
    <message>
        <source>Stop at the limit</source>
        <translation>到达上限即停止</translation>
    </message>
    <message>
        <source>context —</source>
        <translation>上下文 —</translation>
    </message>
    <message>
        <source>No model is loaded</source>
        <translation>未加载模型</translation>
    </message>
    <message>
        <source>… / {limit:,}</source>
        <translation>… / {limit:,}</translation>
    </message>
    <message>
        <source>Counting this chat's tokens…</source>
        <translation>正在统计此对话的词元…</translation>
    </message>
    <message>
        <source>{used:,} / {limit:,}</source>
        <translation>{used:,} / {limit:,}</translation>
    </message>
    <message>
        <source>This chat's next prompt takes {used:,} of the model's {limit:,} context tokens</source>
        <translation>此对话的下一个提示占用模型 {limit:,} 个上下文词元中的 {used:,} 个</translation>
    </message>
    <message>
        <source>{n} earlier messages are left out to make it fit</source>
        <translation>为了放得下，省略了 {n} 条较早的消息</translation>
    </message>
    <message>
        <source>It does not fit: start a new chat or change the context policy</source>
        <translation>放不下：请新建对话或更改上下文策略</translation>
    </message>
    <message>
        <source>When the context is full</source>
        <translation>上下文已满时</translation>
    </message>
    <message>
        <source>What this chat does when it no longer fits the model's context: leave out the oldest messages, keep the system prompt and first exchange and leave out the middle, or stop and say so</source>
        <translation>此对话超出模型上下文时的做法：省略最早的消息；保留系统提示和第一轮问答而省略中间部分；或停止并说明原因</translation>
    </message>
    <message>
        <source>Context warning</source>
        <translation>上下文警告</translation>
    </message>
    <message>
        <source>Remove {name}</source>
        <translation>移除 {name}</translation>
    </message>
    <message>
        <source>code</source>
        <translation>代码</translation>
    </message>
    <message>
        <source>text</source>
        <translation>文本</translation>
    </message>
    <message>
        <source>counting…</source>
        <translation>统计中…</translation>
    </message>
    <message>
        <source>{n:,} tokens</source>
        <translation>{n:,} 个词元</translation>
    </message>
    <message>
        <source>{kind}, {chars:,} characters: sent as plain text after your message</source>
        <translation>{kind}，{chars:,} 个字符：作为纯文本附在你的消息之后发送</translation>
    </message>
</context>
<context>
    <name>ChatView</name>
    <message>
        <source>Attached:</source>
        <translation>附件：</translation>
    </message>
    <message>
        <source>{n:,} tokens</source>
        <translation>{n:,} 个词元</translation>
    </message>
</context>
<context>
    <name>MainWindow</name>
    <message>
        <source>Attach…</source>
        <translation>附加文件…</translation>
    </message>
    <message>
        <source>When the context is full:</source>
        <translation>上下文已满时：</translation>
    </message>
    <message>
        <source>Attach files</source>
        <translation>附加文件</translation>
    </message>
    <message>
        <source>Attach text, Markdown, code or PDF files to the message; each shows the tokens it takes</source>
        <translation>为消息附加文本、Markdown、代码或 PDF 文件；每个文件都会显示它占用的词元数</translation>
    </message>
    <message>
        <source>Context meter</source>
        <translation>上下文用量</translation>
    </message>
    <message>
        <source>Attached files</source>
        <translation>已附加的文件</translation>
    </message>
</context>
<context>
    <name>Dashboard</name>
    <message>
        <source>seconds ago</source>
        <translation>秒前</translation>
    </message>
    <message>
        <source>No reply yet: the speeds appear with the first one.</source>
        <translation>尚无回复：第一条回复后这里会显示速度。</translation>
    </message>
    <message>
        <source>A dense model has no experts to cache: all its weights stay in memory.</source>
        <translation>稠密模型没有需要缓存的专家：全部权重都留在内存中。</translation>
    </message>
    <message>
        <source>The last reply was written before the dashboard opened (its figures are below); the next one is drawn here.</source>
        <translation>上一条回复写于仪表盘打开之前（数据见下方）；下一条回复会画在这里。</translation>
    </message>
</context>
<context>
    <name>RemoteDialog</name>
    <message>
        <source>Press Fetch again to send it anyway.</source>
        <translation>再次按“获取模型列表”仍然发送。</translation>
    </message>
    <message>
        <source>The API key would travel unencrypted (http://) to another machine, where anyone on the network can read it; use https:// if the server offers it.</source>
        <translation>API 密钥将以未加密的方式（http://）发送到另一台机器，网络上的任何人都能读取它；如果服务器支持，请使用 https://。</translation>
    </message>
    <message>
        <source>Remote endpoint</source>
        <translation>远程端点</translation>
    </message>
    <message>
        <source>Endpoint address</source>
        <translation>端点地址</translation>
    </message>
    <message>
        <source>API key</source>
        <translation>API 密钥</translation>
    </message>
    <message>
        <source>none</source>
        <translation>无</translation>
    </message>
    <message>
        <source>Model</source>
        <translation>模型</translation>
    </message>
    <message>
        <source>Fetch models</source>
        <translation>获取模型列表</translation>
    </message>
    <message>
        <source>Connection status</source>
        <translation>连接状态</translation>
    </message>
    <message>
        <source>Address</source>
        <translation>地址</translation>
    </message>
    <message>
        <source>Connect</source>
        <translation>连接</translation>
    </message>
    <message>
        <source>Chat through an OpenAI-compatible server: llama.cpp's llama-server, vLLM, Ollama or another Colibri. The key is kept in the system keyring.</source>
        <translation>通过 OpenAI 兼容的服务器对话：llama.cpp 的 llama-server、vLLM、Ollama 或另一台 Colibri。密钥保存在系统密钥环中。</translation>
    </message>
    <message>
        <source>kept in the system keyring (type to replace)</source>
        <translation>已保存在系统密钥环中（输入可替换）</translation>
    </message>
    <message>
        <source>Asking {url} for its models…</source>
        <translation>正在向 {url} 获取模型列表…</translation>
    </message>
    <message>
        <source>{url} serves {n} model(s)</source>
        <translation>{url} 提供 {n} 个模型</translation>
    </message>
    <message>
        <source>{url} serves no model</source>
        <translation>{url} 没有提供模型</translation>
    </message>
    <message>
        <source>Press Connect again to use it anyway.</source>
        <translation>再次点击“连接”仍可使用它。</translation>
    </message>
</context>
<context>
    <name>ModelInfo</name>
    <message>
        <source>Source</source>
        <translation>来源</translation>
    </message>
    <message>
        <source>GGUF file</source>
        <translation>GGUF 文件</translation>
    </message>
    <message>
        <source>Hugging Face folder</source>
        <translation>Hugging Face 文件夹</translation>
    </message>
    <message>
        <source>Architecture</source>
        <translation>架构</translation>
    </message>
    <message>
        <source>Layers</source>
        <translation>层数</translation>
    </message>
    <message>
        <source>{n} (hidden size {hidden}, {heads} heads, {kv} KV heads)</source>
        <translation>{n}（隐藏维度 {hidden}，{heads} 个注意力头，{kv} 个 KV 头）</translation>
    </message>
    <message>
        <source>full attention</source>
        <translation>全注意力</translation>
    </message>
    <message>
        <source>sliding window of {n}</source>
        <translation>{n} 的滑动窗口</translation>
    </message>
    <message>
        <source>linear attention (fixed state)</source>
        <translation>线性注意力（固定状态）</translation>
    </message>
    <message>
        <source>short conv (fixed state)</source>
        <translation>短卷积（固定状态）</translation>
    </message>
    <message>
        <source>Layer kinds</source>
        <translation>层类型</translation>
    </message>
    <message>
        <source>, plus a shared expert of width {width}</source>
        <translation>，外加一个宽度为 {width} 的共享专家</translation>
    </message>
    <message>
        <source>Experts</source>
        <translation>专家</translation>
    </message>
    <message>
        <source>{n} per layer, width {width}</source>
        <translation>每层 {n} 个，宽度 {width}</translation>
    </message>
    <message>
        <source>Top-k</source>
        <translation>Top-k</translation>
    </message>
    <message>
        <source>{k} experts picked per token</source>
        <translation>每个词元选用 {k} 个专家</translation>
    </message>
    <message>
        <source>none: a dense model (one MLP per layer)</source>
        <translation>无：稠密模型（每层一个 MLP）</translation>
    </message>
    <message>
        <source>Parameters</source>
        <translation>参数</translation>
    </message>
    <message>
        <source>{total} in all, {active} used per token</source>
        <translation>共 {total}，每个词元使用 {active}</translation>
    </message>
    <message>
        <source>Vocabulary</source>
        <translation>词表</translation>
    </message>
    <message>
        <source>{n:,} tokens</source>
        <translation>{n:,} 个词元</translation>
    </message>
    <message>
        <source>Context</source>
        <translation>上下文</translation>
    </message>
    <message>
        <source>up to {n:,} tokens</source>
        <translation>最多 {n:,} 个词元</translation>
    </message>
</context>
<context>
    <name>ContextCounting</name>
    <message>
        <source>Reading {name}…</source>
        <translation>正在读取 {name}…</translation>
    </message>
    <message>
        <source>Attach files</source>
        <translation>附加文件</translation>
    </message>
    <message>
        <source>Attaching a file</source>
        <translation>附加文件</translation>
    </message>
    <message>
        <source>Will not fit: with this message the chat takes {used:,} of the model's {limit:,} tokens, and this chat stops at the limit. Start a new chat or choose another policy below.</source>
        <translation>放不下：加上这条消息，对话将占用模型 {limit:,} 个词元中的 {used:,} 个，而此对话的策略是到达上限即停止。请新建对话，或在下方选择其他策略。</translation>
    </message>
    <message>
        <source>Will not fit: this message and its attachments take {used:,} of the model's {limit:,} tokens even with every earlier message left out. Remove an attachment or shorten the message.</source>
        <translation>放不下：即使省略所有较早的消息，这条消息及其附件仍占用模型 {limit:,} 个词元中的 {used:,} 个。请移除附件或缩短消息。</translation>
    </message>
    <message>
        <source>Sending leaves {n} earlier messages out of the model's context to make room.</source>
        <translation>发送时将有 {n} 条较早的消息不放入模型的上下文，以腾出空间。</translation>
    </message>
</context>
<context>
    <name>ConversationList</name>
    <message>
        <source>Rename chat</source>
        <translation>重命名对话</translation>
    </message>
    <message>
        <source>Title:</source>
        <translation>标题：</translation>
    </message>
    <message>
        <source>Delete chat</source>
        <translation>删除对话</translation>
    </message>
    <message>
        <source>Delete “{title}” and all its messages?</source>
        <translation>删除“{title}”及其全部消息？</translation>
    </message>
    <message>
        <source>Rename…</source>
        <translation>重命名…</translation>
    </message>
    <message>
        <source>Delete</source>
        <translation>删除</translation>
    </message>
    <message>
        <source>Export chat</source>
        <translation>导出对话</translation>
    </message>
    <message>
        <source>Exported to {path}</source>
        <translation>已导出到 {path}</translation>
    </message>
    <message>
        <source>A reply is being written in “{title}”; Stop (Esc) ends it.</source>
        <translation>“{title}”中正在生成回复；按停止（Esc）可结束。</translation>
    </message>
</context>
<context>
    <name>DashboardDock</name>
    <message>
        <source>Performance dashboard</source>
        <translation>性能仪表盘</translation>
    </message>
    <message>
        <source>Performance</source>
        <translation>性能</translation>
    </message>
</context>
<context>
    <name>ModelMenu</name>
    <message>
        <source>No model</source>
        <translation>没有模型</translation>
    </message>
    <message>
        <source>Import…</source>
        <translation>导入…</translation>
    </message>
    <message>
        <source>{model} is ready. Type a message below.</source>
        <translation>{model} 已就绪。请在下方输入消息。</translation>
    </message>
    <message>
        <source>No model is loaded. {reason} Pick or import one from the model list above.</source>
        <translation>没有加载模型。{reason} 请在上方的模型列表中选择或导入一个。</translation>
    </message>
    <message>
        <source>Converting the model into your data folder…</source>
        <translation>正在把模型转换到你的数据文件夹…</translation>
    </message>
    <message>
        <source>Loading {name}…</source>
        <translation>正在加载 {name}…</translation>
    </message>
    <message>
        <source>Looking for your model…</source>
        <translation>正在查找你的模型…</translation>
    </message>
</context>
<context>
    <name>ReplyStreaming</name>
    <message>
        <source>The context was full: {n} earlier messages were left out of this reply</source>
        <translation>上下文已满：{n} 条较早的消息未纳入这次回复</translation>
    </message>
    <message>
        <source>reading your message: {pct:.0%}</source>
        <translation>正在读取你的消息：{pct:.0%}</translation>
    </message>
    <message>
        <source>The reply stopped because the context is full: start a new chat, or raise the context length in Settings</source>
        <translation>上下文已满，回复已停止：请新建对话，或在设置中增大上下文长度</translation>
    </message>
    <message>
        <source>Editing a message: Enter sends it as a new version (the earlier one stays, ‹ › browses them) · Esc cancels</source>
        <translation>正在编辑消息：Enter 将其作为新版本发送（旧版本保留，用 ‹ › 浏览）· Esc 取消</translation>
    </message>
    <message>
        <source>Delete this message?</source>
        <translation>删除这条消息？</translation>
    </message>
    <message>
        <source>Delete this message and the replies below it (every version of them)?</source>
        <translation>删除这条消息及其下方的回复（包括它们的所有版本）？</translation>
    </message>
    <message>
        <source>Delete</source>
        <translation>删除</translation>
    </message>
</context>
<context>
    <name>ServerMenu</name>
    <message>
        <source>serving at {url}</source>
        <translation>服务地址 {url}</translation>
    </message>
    <message>
        <source>Serve on localhost</source>
        <translation>在本机提供服务</translation>
    </message>
</context>
<context>
    <name>StatusLine</name>
    <message>
        <source>context with your message {used:,} / {limit:,}</source>
        <translation>上下文（含正在写的消息）{used:,} / {limit:,}</translation>
    </message>
    <message>
        <source>Send</source>
        <translation>发送</translation>
    </message>
    <message>
        <source>Stop</source>
        <translation>停止</translation>
    </message>
    <message>
        <source>Stop the reply</source>
        <translation>停止回复</translation>
    </message>
    <message>
        <source>Send the message</source>
        <translation>发送消息</translation>
    </message>
    <message>
        <source>Stop writing the reply (Esc)</source>
        <translation>停止生成回复 (Esc)</translation>
    </message>
    <message>
        <source>Send the message (Enter or Ctrl+Return)</source>
        <translation>发送消息 (Enter 或 Ctrl+Return)</translation>
    </message>
    <message>
        <source>{rate:.1f} tok/s · first token {ttft:.2f} s</source>
        <translation>{rate:.1f} 词元/秒 · 首词元 {ttft:.2f} 秒</translation>
    </message>
    <message>
        <source>context {used:,} / {limit:,}</source>
        <translation>上下文 {used:,} / {limit:,}</translation>
    </message>
    <message>
        <source>context —</source>
        <translation>上下文 —</translation>
    </message>
    <message>
        <source>memory {mb:,.0f} MB</source>
        <translation>内存 {mb:,.0f} MB</translation>
    </message>
    <message>
        <source>reading your message: {pct:.0%}</source>
        <translation>正在读取你的消息：{pct:.0%}</translation>
    </message>
    <message>
        <source>reading your message…</source>
        <translation>正在读取你的消息…</translation>
    </message>
    <message>
        <source>last reply {rate:.1f} tok/s · first token {ttft:.2f} s</source>
        <translation>上次回复 {rate:.1f} 词元/秒 · 首词元 {ttft:.2f} 秒</translation>
    </message>
    <message>
        <source>no reply yet</source>
        <translation>尚无回复</translation>
    </message>
    <message>
        <source>context … / {limit:,}</source>
        <translation>上下文 … / {limit:,}</translation>
    </message>
    <message>
        <source>first token {ttft:.2f} s · writing…</source>
        <translation>首词元 {ttft:.2f} 秒 · 正在生成…</translation>
    </message>
    <message>
        <source>Counted when the reply being written ends</source>
        <translation>正在生成的回复结束后再计数</translation>
    </message>
    <message>
        <source>⚠ slowed by other programs</source>
        <translation>⚠ 被其他程序拖慢</translation>
    </message>
    <message>
        <source>Slower than usual: {why}</source>
        <translation>比平时慢：{why}</translation>
    </message>
</context>
<context>
    <name>ThinkingSwitch</name>
    <message>
        <source>Thinking: on</source>
        <translation>思考：开</translation>
    </message>
    <message>
        <source>Thinking: off</source>
        <translation>思考：关</translation>
    </message>
</context>
<context>
    <name>FoundModelsPanel</name>
    <message>
        <source>Models found on this computer</source>
        <translation>本机上找到的模型</translation>
    </message>
    <message>
        <source>Your converted models</source>
        <translation>你转换过的模型</translation>
    </message>
    <message>
        <source>Looking for models on this computer…</source>
        <translation>正在查找本机上的模型…</translation>
    </message>
    <message>
        <source>fits: needs {need}</source>
        <translation>放得下：需要 {need}</translation>
    </message>
    <message>
        <source>too big: needs {need}, {free} free</source>
        <translation>太大：需要 {need}，可用 {free}</translation>
    </message>
    <message>
        <source>opened in place, no copy</source>
        <translation>原地打开，不复制</translation>
    </message>
    <message>
        <source>Delete a converted model</source>
        <translation>删除一个转换过的模型</translation>
    </message>
    <message>
        <source>Model</source>
        <translation>模型</translation>
    </message>
    <message>
        <source>Where</source>
        <translation>位置</translation>
    </message>
    <message>
        <source>Architecture</source>
        <translation>架构</translation>
    </message>
    <message>
        <source>Size</source>
        <translation>大小</translation>
    </message>
    <message>
        <source>Quantization</source>
        <translation>量化</translation>
    </message>
    <message>
        <source>Experts</source>
        <translation>专家</translation>
    </message>
    <message>
        <source>Memory on this computer</source>
        <translation>本机内存</translation>
    </message>
    <message>
        <source>Opening it</source>
        <translation>打开方式</translation>
    </message>
    <message>
        <source>Converted model</source>
        <translation>转换过的模型</translation>
    </message>
    <message>
        <source>On disk</source>
        <translation>磁盘占用</translation>
    </message>
    <message>
        <source>No GGUF found in Downloads, LM Studio, Ollama or the Hugging Face cache: give a path above.</source>
        <translation>在“下载”、LM Studio、Ollama 和 Hugging Face 缓存中都没有找到 GGUF：请在上方给出路径。</translation>
    </message>
    <message>
        <source>&lt;b&gt;Your converted models&lt;/b&gt;: none yet</source>
        <translation>&lt;b&gt;你转换过的模型&lt;/b&gt;：还没有</translation>
    </message>
    <message>
        <source>Delete…</source>
        <translation>删除…</translation>
    </message>
    <message>
        <source>dense</source>
        <translation>稠密</translation>
    </message>
    <message>
        <source>{used} of {n}</source>
        <translation>{n} 选 {used}</translation>
    </message>
    <message>
        <source>copies {size}</source>
        <translation>复制 {size}</translation>
    </message>
    <message>
        <source>Delete {name} ({size}) from your library? Its source file is not touched.</source>
        <translation>从模型库删除 {name}（{size}）？源文件不会被改动。</translation>
    </message>
    <message>
        <source>&lt;b&gt;Models on this computer&lt;/b&gt; ({n}): pick one to read it, or give a path above</source>
        <translation>&lt;b&gt;本机上的模型&lt;/b&gt;（{n} 个）：选一个读取，或在上方给出路径</translation>
    </message>
    <message>
        <source>&lt;b&gt;Your converted models&lt;/b&gt; ({n}, {size} on disk)</source>
        <translation>&lt;b&gt;你转换过的模型&lt;/b&gt;（{n} 个，占用磁盘 {size}）</translation>
    </message>
    <message>
        <source>Delete {name}</source>
        <translation>删除 {name}</translation>
    </message>
    <message>
        <source>Not deleted: {error}</source>
        <translation>未删除：{error}</translation>
    </message>
    <message>
        <source> ({n} parts)</source>
        <translation>（{n} 个分片）</translation>
    </message>
    <message>
        <source>{free} free now</source>
        <translation>当前可用 {free}</translation>
    </message>
</context>
</TS>
